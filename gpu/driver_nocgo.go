//go:build !cgo

package gpu

import "unsafe"

// The driver layer of a program built without cgo (see driver.go): the
// driver cannot be loaded, and every call answers what the C shims answer
// before a driver is loaded, resultFunctionNotFound. The signatures are
// driver_cgo.go's; `CGO_ENABLED=0 go build` checks that they still match.

const notFound = resultFunctionNotFound

func loadDriver(string) error { return ErrNoCgo }

func cuInit() CUDAResult                                        { return notFound }
func cuDriverGetVersion() (int, CUDAResult)                     { return 0, notFound }
func cuGetErrorString(CUDAResult) (string, bool)                { return "", false }
func cuDeviceGetCount() (int, CUDAResult)                       { return 0, notFound }
func cuDeviceGet(int) (cuDevice, CUDAResult)                    { return 0, notFound }
func cuDeviceGetName(cuDevice) (string, CUDAResult)             { return "", notFound }
func cuDevicePrimaryCtxRetain(cuDevice) (cuContext, CUDAResult) { return 0, notFound }
func cuDevicePrimaryCtxRelease(cuDevice) CUDAResult             { return notFound }
func cuCtxSetCurrent(cuContext) CUDAResult                      { return notFound }

func cuDeviceGetAttribute(cuDeviceAttribute, cuDevice) (int, CUDAResult) { return 0, notFound }
func cuDeviceGetUuid(cuDevice) ([16]byte, CUDAResult)                    { return [16]byte{}, notFound }

func cuMemGetInfo(cuContext) (free, total uint64, r CUDAResult)             { return 0, 0, notFound }
func cuMemAlloc(cuContext, int) (uint64, CUDAResult)                        { return 0, notFound }
func cuMemFree(cuContext, uint64) CUDAResult                                { return notFound }
func cuMemHostAlloc(cuContext, int) (unsafe.Pointer, CUDAResult)            { return nil, notFound }
func cuMemFreeHost(cuContext, unsafe.Pointer) CUDAResult                    { return notFound }
func cuMemcpyHtoDAsync(cuContext, uint64, []byte, cuStream) CUDAResult      { return notFound }
func cuMemcpyDtoHAsync(cuContext, []byte, uint64, cuStream) CUDAResult      { return notFound }
func cuMemcpyDtoDAsync(cuContext, uint64, uint64, int, cuStream) CUDAResult { return notFound }
func cuMemsetD8Async(cuContext, uint64, byte, int, cuStream) CUDAResult     { return notFound }

func cuStreamCreate(cuContext) (cuStream, CUDAResult)                     { return 0, notFound }
func cuStreamDestroy(cuContext, cuStream) CUDAResult                      { return notFound }
func cuStreamQuery(cuContext, cuStream) CUDAResult                        { return notFound }
func cuStreamWaitEvent(cuContext, cuStream, cuEvent) CUDAResult           { return notFound }
func cuStreamWaitValue32(cuContext, cuStream, uint64, uint32) CUDAResult  { return notFound }
func cuStreamWriteValue32(cuContext, cuStream, uint64, uint32) CUDAResult { return notFound }
func cuStreamWaitValue64(cuContext, cuStream, uint64, uint64) CUDAResult  { return notFound }
func cuStreamWriteValue64(cuContext, cuStream, uint64, uint64) CUDAResult { return notFound }
func cuEventCreate(cuContext) (cuEvent, CUDAResult)                       { return 0, notFound }
func cuEventCreateTimed(cuContext) (cuEvent, CUDAResult)                  { return 0, notFound }

func cuEventElapsedTime(cuContext, cuEvent, cuEvent) (float32, CUDAResult) { return 0, notFound }

func cuEventRecord(cuContext, cuEvent, cuStream) CUDAResult { return notFound }
func cuEventQuery(cuContext, cuEvent) CUDAResult            { return notFound }
func cuEventDestroy(cuContext, cuEvent) CUDAResult          { return notFound }

func cuMemGetAddressRange(cuContext, uint64) (base, size uint64, r CUDAResult) { return 0, 0, notFound }
func cuPointerGetBufferID(cuContext, uint64) (uint64, CUDAResult)              { return 0, notFound }
func cuIpcGetMemHandle(cuContext, uint64) (IPCHandle, CUDAResult)              { return IPCHandle{}, notFound }
func cuIpcOpenMemHandle(cuContext, *IPCHandle) (uint64, CUDAResult)            { return 0, notFound }
func cuIpcCloseMemHandle(cuContext, uint64) CUDAResult                         { return notFound }

func moduleLoad(cuContext, string) (m cuModule, log string, r CUDAResult)      { return 0, "", notFound }
func cuModuleGetFunction(cuContext, cuModule, string) (cuFunction, CUDAResult) { return 0, notFound }
func cuModuleUnload(cuContext, cuModule) CUDAResult                            { return notFound }

func cuLaunchKernel(cuContext, cuFunction, uint32, uint32, cuStream, ...uint64) CUDAResult {
	return notFound
}

func copyBatch(_ cuContext, _, _, sizes []uint64, _ cuStream, _ bool) (how BatchPath, batchErr, r CUDAResult) {
	if len(sizes) == 0 {
		return BatchNone, 0, 0
	}
	return BatchNone, 0, notFound
}
