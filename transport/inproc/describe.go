package inproc

import "github.com/weightcast/weightcast/transport"

// Descriptor is how inproc describes itself to the registry: every rank
// a goroutine of this process, host memory, no rendezvous; "auto" never
// picks it, since ranks that met at a rendezvous are processes.
var Descriptor = transport.Descriptor{Name: Name, Open: Open, InProcess: true}

// Bus is the in-process metadata bus, for the ranks of Descriptor.
var Bus = transport.Bus{Name: Name, OpenPublisher: OpenPublisher, OpenSubscriber: OpenSubscriber, InProcess: true}

func init() {
	transport.RegisterDescriptor(Descriptor)
	transport.RegisterBus(Bus)
}
