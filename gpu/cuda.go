package gpu

import (
	"errors"
	"fmt"
	"sync"
)

// DriverLibrary is the file name OpenCUDA passes to the dynamic loader.
const DriverLibrary = "libcuda.so.1"

// ErrNoDriver is returned (wrapped, test with errors.Is) by every CUDA entry
// point when the CUDA driver library cannot be loaded on this machine.
var ErrNoDriver = errors.New("gpu: no CUDA driver")

// ErrNoDevice is matched (errors.Is) by errors that say the driver found no
// CUDA device.
var ErrNoDevice = errors.New("gpu: no CUDA device")

// ErrMissingSymbol is matched (errors.Is) by errors from a driver function
// that the loaded libcuda does not export (a driver older than the call).
var ErrMissingSymbol = errors.New("gpu: function missing from the CUDA driver")

var (
	openOnce sync.Once
	openErr  error
)

// OpenCUDA loads libcuda.so.1 and initializes the driver. It runs once per
// process; later calls return the first call's result. Every other CUDA
// function of this package calls it, so calling it first is only needed to
// ask whether CUDA is usable here. The error wraps ErrNoDriver when the
// library is absent (and also ErrNoCgo in a program built without cgo), and
// ErrNoDevice when the driver sees no GPU.
func OpenCUDA() error {
	openOnce.Do(func() { openErr = openCUDA() })
	return openErr
}

func openCUDA() error {
	if err := loadDriver(DriverLibrary); err != nil {
		if errors.Is(err, ErrNoCgo) {
			return fmt.Errorf("%w: cannot load %s: %w", ErrNoDriver, DriverLibrary, err)
		}
		return fmt.Errorf("%w: cannot load %s (%v); install the NVIDIA driver or run on a machine with a GPU",
			ErrNoDriver, DriverLibrary, err)
	}
	if r := cuInit(); r != 0 {
		if r == resultFunctionNotFound {
			return fmt.Errorf("%w: %s has no cuInit; it is not a CUDA driver library", ErrNoDriver, DriverLibrary)
		}
		return &Error{Op: "cuInit", Device: -1, Result: r}
	}
	return nil
}

// DriverVersion returns the CUDA version the driver supports, encoded as
// 1000*major + 10*minor (13000 for CUDA 13.0).
func DriverVersion() (int, error) {
	if err := OpenCUDA(); err != nil {
		return 0, err
	}
	return driverVersion()
}

// driverVersion asks the dispatch table without loading the driver first.
func driverVersion() (int, error) {
	v, r := cuDriverGetVersion()
	if r != 0 {
		return 0, &Error{Op: "cuDriverGetVersion", Device: -1, Result: r}
	}
	return v, nil
}

// DeviceCount returns how many CUDA devices the driver sees.
func DeviceCount() (int, error) {
	if err := OpenCUDA(); err != nil {
		return 0, err
	}
	n, r := cuDeviceGetCount()
	if r != 0 {
		return 0, &Error{Op: "cuDeviceGetCount", Device: -1, Result: r}
	}
	return n, nil
}

// CUDAResult is a CUresult, the CUDA driver API's status code. Its Error
// method names the code from a built-in table, so it reads well even where
// the driver is not installed.
type CUDAResult int

// resultFunctionNotFound is the shim's code for a symbol that the loaded
// driver lacks (or a driver that was never loaded); it is no CUDA code
// (WC_CUDA_FUNCTION_NOT_FOUND of cuda_shim.h).
const resultFunctionNotFound CUDAResult = 0x7fff0001

// The CUresult values this package looks at.
const (
	CUDASuccess            CUDAResult = 0
	CUDAErrorInvalidValue  CUDAResult = 1
	CUDAErrorOutOfMemory   CUDAResult = 2
	CUDAErrorNoDevice      CUDAResult = 100
	CUDAErrorInvalidHandle CUDAResult = 400
	CUDAErrorNotReady      CUDAResult = 600
)

// Name returns the CUresult's name ("CUDA_ERROR_OUT_OF_MEMORY"), or
// "CUDA_ERROR_<n>" for a code missing from the table.
func (r CUDAResult) Name() string {
	if r == resultFunctionNotFound {
		return "FUNCTION_NOT_FOUND"
	}
	if n, ok := cudaResultNames[r]; ok {
		return n
	}
	return fmt.Sprintf("CUDA_ERROR_%d", int(r))
}

// Error returns the name, the number and, when the driver is loaded, the
// driver's description of the code.
func (r CUDAResult) Error() string {
	if r == resultFunctionNotFound {
		return "function not found in the loaded CUDA driver (or no driver loaded)"
	}
	s := fmt.Sprintf("%s (%d)", r.Name(), int(r))
	if desc, ok := cuGetErrorString(r); ok {
		s += ": " + desc
	}
	return s
}

// Is makes errors.Is(r, ErrMissingSymbol) and errors.Is(r, ErrNoDevice) work.
func (r CUDAResult) Is(target error) bool {
	switch target {
	case ErrMissingSymbol:
		return r == resultFunctionNotFound
	case ErrNoDevice:
		return r == CUDAErrorNoDevice
	}
	return false
}

// Error is a failed CUDA driver call: which call, on which device, and the
// CUresult. It unwraps to the CUDAResult.
type Error struct {
	Op     string // the driver function, "cuMemAlloc_v2"
	Device int    // the device ordinal, -1 when none applies
	Detail string // what the call was doing ("1073741824 bytes"), may be empty
	Result CUDAResult
}

// Error names the driver call, the device and the result.
func (e *Error) Error() string {
	s := "gpu: " + e.Op
	if e.Device >= 0 {
		s += fmt.Sprintf(" on cuda:%d", e.Device)
	}
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s + ": " + e.Result.Error()
}

// Unwrap returns the CUDA result, for errors.Is.
func (e *Error) Unwrap() error { return e.Result }

// cudaResultNames names the CUresult values of cuda.h (CUDA 13.0).
var cudaResultNames = map[CUDAResult]string{
	0:   "CUDA_SUCCESS",
	1:   "CUDA_ERROR_INVALID_VALUE",
	2:   "CUDA_ERROR_OUT_OF_MEMORY",
	3:   "CUDA_ERROR_NOT_INITIALIZED",
	4:   "CUDA_ERROR_DEINITIALIZED",
	5:   "CUDA_ERROR_PROFILER_DISABLED",
	6:   "CUDA_ERROR_PROFILER_NOT_INITIALIZED",
	7:   "CUDA_ERROR_PROFILER_ALREADY_STARTED",
	8:   "CUDA_ERROR_PROFILER_ALREADY_STOPPED",
	34:  "CUDA_ERROR_STUB_LIBRARY",
	46:  "CUDA_ERROR_DEVICE_UNAVAILABLE",
	100: "CUDA_ERROR_NO_DEVICE",
	101: "CUDA_ERROR_INVALID_DEVICE",
	102: "CUDA_ERROR_DEVICE_NOT_LICENSED",
	200: "CUDA_ERROR_INVALID_IMAGE",
	201: "CUDA_ERROR_INVALID_CONTEXT",
	202: "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
	205: "CUDA_ERROR_MAP_FAILED",
	206: "CUDA_ERROR_UNMAP_FAILED",
	207: "CUDA_ERROR_ARRAY_IS_MAPPED",
	208: "CUDA_ERROR_ALREADY_MAPPED",
	209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
	210: "CUDA_ERROR_ALREADY_ACQUIRED",
	211: "CUDA_ERROR_NOT_MAPPED",
	212: "CUDA_ERROR_NOT_MAPPED_AS_ARRAY",
	213: "CUDA_ERROR_NOT_MAPPED_AS_POINTER",
	214: "CUDA_ERROR_ECC_UNCORRECTABLE",
	215: "CUDA_ERROR_UNSUPPORTED_LIMIT",
	216: "CUDA_ERROR_CONTEXT_ALREADY_IN_USE",
	217: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	218: "CUDA_ERROR_INVALID_PTX",
	219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
	220: "CUDA_ERROR_NVLINK_UNCORRECTABLE",
	221: "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
	222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
	223: "CUDA_ERROR_JIT_COMPILATION_DISABLED",
	224: "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
	225: "CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC",
	226: "CUDA_ERROR_CONTAINED",
	300: "CUDA_ERROR_INVALID_SOURCE",
	301: "CUDA_ERROR_FILE_NOT_FOUND",
	302: "CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND",
	303: "CUDA_ERROR_SHARED_OBJECT_INIT_FAILED",
	304: "CUDA_ERROR_OPERATING_SYSTEM",
	400: "CUDA_ERROR_INVALID_HANDLE",
	401: "CUDA_ERROR_ILLEGAL_STATE",
	402: "CUDA_ERROR_LOSSY_QUERY",
	500: "CUDA_ERROR_NOT_FOUND",
	600: "CUDA_ERROR_NOT_READY",
	700: "CUDA_ERROR_ILLEGAL_ADDRESS",
	701: "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
	702: "CUDA_ERROR_LAUNCH_TIMEOUT",
	703: "CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING",
	704: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	705: "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
	708: "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
	709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
	710: "CUDA_ERROR_ASSERT",
	711: "CUDA_ERROR_TOO_MANY_PEERS",
	712: "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
	713: "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
	714: "CUDA_ERROR_HARDWARE_STACK_ERROR",
	715: "CUDA_ERROR_ILLEGAL_INSTRUCTION",
	716: "CUDA_ERROR_MISALIGNED_ADDRESS",
	717: "CUDA_ERROR_INVALID_ADDRESS_SPACE",
	718: "CUDA_ERROR_INVALID_PC",
	719: "CUDA_ERROR_LAUNCH_FAILED",
	720: "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
	721: "CUDA_ERROR_TENSOR_MEMORY_LEAK",
	800: "CUDA_ERROR_NOT_PERMITTED",
	801: "CUDA_ERROR_NOT_SUPPORTED",
	802: "CUDA_ERROR_SYSTEM_NOT_READY",
	803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
	805: "CUDA_ERROR_MPS_CONNECTION_FAILED",
	806: "CUDA_ERROR_MPS_RPC_FAILURE",
	807: "CUDA_ERROR_MPS_SERVER_NOT_READY",
	808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
	809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
	810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
	811: "CUDA_ERROR_CDP_NOT_SUPPORTED",
	812: "CUDA_ERROR_CDP_VERSION_MISMATCH",
	900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
	901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
	902: "CUDA_ERROR_STREAM_CAPTURE_MERGE",
	903: "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
	904: "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
	905: "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
	906: "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
	907: "CUDA_ERROR_CAPTURED_EVENT",
	908: "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
	909: "CUDA_ERROR_TIMEOUT",
	910: "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
	911: "CUDA_ERROR_EXTERNAL_DEVICE",
	912: "CUDA_ERROR_INVALID_CLUSTER_CONFIGURATION",
	913: "CUDA_ERROR_FUNCTION_NOT_LOADED",
	914: "CUDA_ERROR_INVALID_RESOURCE_TYPE",
	915: "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
	916: "CUDA_ERROR_KEY_ROTATION",
	917: "CUDA_ERROR_STREAM_DETACHED",
	999: "CUDA_ERROR_UNKNOWN",
}
