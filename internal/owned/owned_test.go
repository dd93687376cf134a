package owned

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// childEnv, set in a child of the test binary, makes it create an owned
// directory, print its path and wait to be killed.
const childEnv = "WEIGHTCAST_OWNED_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		dir, err := MkdirTemp("owned-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(dir)
		time.Sleep(time.Minute) // killed by the test long before
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSweepRemovesKilledOwners: a directory whose owner was killed with
// SIGKILL is removed; one whose owner lives, one without an owner file,
// one of another pid namespace and one whose pid was recycled are judged
// as they should be.
func TestSweepRemovesKilledOwners(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())

	// A real owner, killed with SIGKILL after making its directory.
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatal("the child printed no directory")
	}
	killed := sc.Text()
	// While it lives, its directory stays.
	if removed, err := Sweep("owned-test-"); err != nil || len(removed) != 0 {
		t.Fatalf("Sweep with the owner alive removed %v (%v)", removed, err)
	}
	cmd.Process.Kill()
	cmd.Wait()

	mine, err := MkdirTemp("owned-test-")
	if err != nil {
		t.Fatal(err)
	}
	unowned := filepath.Join(os.TempDir(), "owned-test-unowned")
	foreign := filepath.Join(os.TempDir(), "owned-test-foreign")
	recycled := filepath.Join(os.TempDir(), "owned-test-recycled")
	other := filepath.Join(os.TempDir(), "other-prefix")
	for _, d := range []string{unowned, foreign, recycled, other} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	me := self()
	write := func(dir, text string) {
		if err := os.WriteFile(filepath.Join(dir, FileName), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(foreign, "pid 1\nstart 1\npidns pid:[1]\n")
	// This process's pid with another start time: the pid was recycled.
	write(recycled, fmt.Sprintf("pid %d\nstart 1\npidns %s\n", me.pid, me.pidNS))
	write(other, fmt.Sprintf("pid 999999999\nstart 1\npidns %s\n", me.pidNS))

	removed, err := Sweep("owned-test-")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(removed)
	want := []string{killed, recycled}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Fatalf("Sweep removed %v, want %v", removed, want)
	}
	for _, d := range []string{mine, unowned, foreign, other} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("%s was removed: %v", d, err)
		}
	}
	for _, d := range want {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s is still there (%v)", d, err)
		}
	}
}

func TestMkdirTempRecordsSelf(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	dir, err := MkdirTemp("owned-test-")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(filepath.Base(dir), "owned-test-") || filepath.Dir(dir) != os.TempDir() {
		t.Fatalf("directory %s: want owned-test-* in %s", dir, os.TempDir())
	}
	o, ok := readOwner(dir)
	if !ok || o != self() {
		t.Fatalf("owner %+v (ok %v), want %+v", o, ok, self())
	}
	if o.start == "" || o.pidNS == "" {
		t.Fatalf("owner %+v lacks its start time or pid namespace", o)
	}
}

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses.
	line := "1234 (a b) c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10"
	state, start, ok := parseStat(line)
	if !ok || state != "S" || start != "98765" {
		t.Fatalf("parseStat = %q, %q, %v; want S, 98765", state, start, ok)
	}
	if _, _, ok := parseStat("1234 (x) S 1"); ok {
		t.Fatal("a short line parsed")
	}
}

// TestProcessEnded: this process has not ended; a child that exited has;
// this pid with another start time (a recycled pid) has; a pid of another
// pid namespace, or of none, is never judged.
func TestProcessEnded(t *testing.T) {
	me := Self()
	if me.PID != os.Getpid() || me.Start == "" || me.PIDNS == "" {
		t.Fatalf("Self() = %+v; want this pid with its start time and pid namespace", me)
	}
	if me.Ended() {
		t.Fatal("this process is judged ended")
	}
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := Process{PID: cmd.Process.Pid, Start: "1", PIDNS: me.PIDNS}
	if !dead.Ended() {
		t.Errorf("exited child %+v is not judged ended", dead)
	}
	if recycled := (Process{PID: me.PID, Start: me.Start + "0", PIDNS: me.PIDNS}); !recycled.Ended() {
		t.Errorf("this pid with another start time %+v is not judged ended", recycled)
	}
	for _, p := range []Process{
		{PID: cmd.Process.Pid, Start: "1", PIDNS: "pid:[1]"},
		{PID: cmd.Process.Pid},
		{},
	} {
		if p.Ended() {
			t.Errorf("%+v is judged ended; it cannot be told here", p)
		}
	}
}
