package embedetcd

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/weightcast/weightcast/auth"
	"github.com/weightcast/weightcast/internal/owned"
)

// Options configures Start.
type Options struct {
	// Addr is the client address to listen on, "host:port". Empty means
	// "127.0.0.1:0": loopback only, on a port the OS picks.
	Addr string
	// DataDir holds the server's data. Empty means a fresh temporary
	// directory, weightcast-etcd-* in os.TempDir, that Close removes; such
	// a server also skips fsync, since its data does not outlive it. The
	// directory records this process as its owner (internal/owned), so
	// that what a killed process left can be removed later. A given
	// directory is kept, and fsync stays on.
	DataDir string
	// Logger receives the server's logs. Nil means errors only, on
	// standard error, and none once Close has begun (a stopping server
	// reports its closed listeners as errors).
	Logger *zap.Logger
	// TLS, when set, makes the server serve clients over TLS 1.3 with
	// this certificate and key, and require client certificates signed by
	// the CA (clients dial https://). Zero means plain HTTP.
	TLS auth.TLSFiles
}

// DirPrefix starts the name of every temporary data directory Start
// makes.
const DirPrefix = "weightcast-etcd-"

// Server is a single-member etcd server running inside this process, for
// a demo or tests that need no separate etcd. Its peer listener is on
// 127.0.0.1 with an OS-picked port; with one member nobody dials it.
type Server struct {
	etcd      *embed.Etcd
	clientURL string
	dataDir   string
	tmpDir    string // dataDir, when Start made it
	closing   atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// Start starts an etcd server in this process and returns once it serves
// clients, or when ctx ends.
func Start(ctx context.Context, opts Options) (*Server, error) {
	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("embedetcd: address %q: %w; give host:port, e.g. 127.0.0.1:2379 or 0.0.0.0:0", addr, err)
	}
	e := &Server{}
	cfg := embed.NewConfig()
	cfg.Dir = opts.DataDir
	if cfg.Dir == "" {
		dir, err := owned.MkdirTemp(DirPrefix)
		if err != nil {
			return nil, fmt.Errorf("embedetcd: data dir: %w", err)
		}
		e.tmpDir, cfg.Dir = dir, dir
		cfg.UnsafeNoFsync = true
	}
	e.dataDir = cfg.Dir
	scheme := "http"
	if !opts.TLS.IsZero() {
		if _, err := opts.TLS.Load(); err != nil { // says which file is wrong before etcd does
			e.removeTmp()
			return nil, fmt.Errorf("embedetcd: %w", err)
		}
		scheme = "https"
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: opts.TLS.Cert, KeyFile: opts.TLS.Key, TrustedCAFile: opts.TLS.CA,
			ClientCertAuth: true, MinVersion: tls.VersionTLS13}
	}
	clientURL := url.URL{Scheme: scheme, Host: addr}
	peerURL := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.Name = "weightcast"
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.InitialClusterToken = "weightcast-" + rand.Text()
	// The HTTP gateway dials the configured client address, which is
	// useless with port 0; clients speak gRPC.
	cfg.EnableGRPCGateway = false
	// One member elects itself after one election timeout; at etcd's
	// defaults (100 ms ticks, 1 s) that is most of the start-up time.
	// This also lowers the shortest lease TTL etcd grants to 1 s.
	cfg.TickMs, cfg.ElectionMs = 10, 100
	lg := opts.Logger
	if lg == nil {
		lg = quietLogger(&e.closing)
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)

	etcd, err := embed.StartEtcd(cfg)
	if err != nil {
		e.removeTmp()
		return nil, fmt.Errorf("embedetcd: starting etcd on %s: %w", addr, err)
	}
	e.etcd = etcd
	// The bound address, which differs from addr when its port is 0.
	bound := etcd.Clients[0].Addr().(*net.TCPAddr)
	host := bound.IP
	if host.IsUnspecified() { // a wildcard listens on loopback too
		host = net.IPv4(127, 0, 0, 1)
	}
	e.clientURL = (&url.URL{Scheme: scheme, Host: net.JoinHostPort(host.String(), fmt.Sprint(bound.Port))}).String()

	select {
	case <-etcd.Server.ReadyNotify():
		return e, nil
	case err := <-etcd.Err():
		e.Close()
		return nil, fmt.Errorf("embedetcd: etcd on %s failed while starting: %w", addr, err)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("embedetcd: etcd on %s not ready: %w", addr, ctx.Err())
	}
}

// ClientURL is the URL clients on this host dial ("http://127.0.0.1:port",
// or https:// with TLS).
// When Addr was a wildcard, other hosts use this host's name with the same
// port.
func (e *Server) ClientURL() string { return e.clientURL }

// DataDir is the directory holding the server's data.
func (e *Server) DataDir() string { return e.dataDir }

// Close stops the server and removes its temporary data directory. It is
// idempotent.
func (e *Server) Close() error {
	e.closeOnce.Do(func() {
		e.closing.Store(true)
		if e.etcd != nil {
			e.etcd.Close()
			<-e.etcd.Server.StopNotify()
		}
		e.closeErr = e.removeTmp()
	})
	return e.closeErr
}

func (e *Server) removeTmp() error {
	if e.tmpDir == "" {
		return nil
	}
	if err := os.RemoveAll(e.tmpDir); err != nil {
		return fmt.Errorf("embedetcd: removing the data dir: %w", err)
	}
	return nil
}

// quietLogger logs errors to standard error until closing is set.
func quietLogger(closing *atomic.Bool) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.Lock(os.Stderr), zap.ErrorLevel)
	return zap.New(untilClosing{core, closing}).Named("etcd")
}

// untilClosing drops every entry once closing is set, and the one error
// etcd logs when its storage version monitor runs before the first raft
// term reached the backend: a start-up race that the monitor retries on
// its own, seen with short election timeouts.
type untilClosing struct {
	zapcore.Core
	closing *atomic.Bool
}

func (c untilClosing) With(fields []zapcore.Field) zapcore.Core {
	return untilClosing{c.Core.With(fields), c.closing}
}

func (c untilClosing) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.closing.Load() || !c.Enabled(ent.Level) {
		return ce
	}
	return ce.AddCore(ent, c)
}

func (c untilClosing) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if ent.Message == "failed to update storage version" {
		for _, f := range fields {
			if err, ok := f.Interface.(error); ok && strings.Contains(err.Error(), "missing term information") {
				return nil
			}
		}
	}
	return c.Core.Write(ent, fields)
}
