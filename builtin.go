package weightcast

// The transports and metadata buses a program using the front door can
// name (Options.Transport) or be given by "auto": each registers itself,
// describing what it needs and can do (transport.Descriptor), and the
// front door asks the registry, never the names.
import (
	_ "github.com/weightcast/weightcast/transport/inproc" // registers "inproc", transport and bus
	_ "github.com/weightcast/weightcast/transport/ipc"    // registers "ipc"
	_ "github.com/weightcast/weightcast/transport/ncclx"  // registers "nccl"
	_ "github.com/weightcast/weightcast/transport/tcp"    // registers "tcp"
	_ "github.com/weightcast/weightcast/transport/zmqbus" // registers the "zmq" bus
)
