package gpu

// RecordOn records a new event at the current end of a CUDA stream that
// this package did not create: another library's stream in this process,
// such as PyTorch's torch.cuda.current_stream().cuda_stream, which lives in
// the same primary context. 0 is the legacy default stream. Waiting for the
// event (Event.Wait, Stream.WaitEvent) orders work after everything the
// other library had queued on that stream, without synchronizing the
// device. The stream must belong to this device and stay alive for the
// call; the caller owns the event and must Close it.
func (d *CUDADevice) RecordOn(stream uintptr) (*Event, error) {
	if err := d.checkOpen(); err != nil {
		return nil, err
	}
	e, err := d.newEvent()
	if err != nil {
		return nil, err
	}
	if r := cuEventRecord(d.ctx, e.e, cuStream(stream)); r != 0 {
		_ = e.Close()
		return nil, d.err("cuEventRecord", "on a foreign stream", r)
	}
	return e, nil
}
