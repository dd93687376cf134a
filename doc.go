// Package weightcast is the library's front door: it places this process
// in a sync group as the sender (rank 0) or as one of the receivers, with
// everything a rank needs set up from one Options — the rendezvous (an
// etcd, or one that rank 0 serves, torchrun style), the join, the watch for
// lost peers, the device its buckets live on, the metadata bus, the byte
// transport and the pool of two buckets — and releases it all, in order,
// with Close.
//
//	s, err := weightcast.OpenSender(ctx, weightcast.Options{Rank: 0, WorldSize: 3, Rendezvous: "etcd://10.0.0.1:2379", RunID: "job-7"})
//	...
//	_, err = s.Send(ctx, model, 1) // returns once every receiver has committed version 1
//
//	r, err := weightcast.OpenReceiver(ctx, weightcast.Options{Rank: 1, WorldSize: 3, Rendezvous: "etcd://10.0.0.1:2379", RunID: "job-7"})
//	...
//	_, err = r.Receive(ctx, sink)
//
// The demo (cmd/demo) and the C library (capi, libweightcast.so, which the
// Python package wraps) both set up their ranks through this package.
//
// SendRefs sends tensors handed in by address (host memory, or device
// memory in the primary context, as a PyTorch tensor's data_ptr() is),
// ordered after the work queued on the caller's CUDA streams. Receive with
// a sink.Views hands a round over bucket by bucket as views.
package weightcast
