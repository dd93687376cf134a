package cast_test

import (
	"encoding/binary"
	"fmt"
	"log"
	"math"

	"github.com/weightcast/weightcast/cast"
	"github.com/weightcast/weightcast/dtype"
)

func ExampleConvert() {
	src := make([]byte, 0, 16)
	for _, v := range []float32{1, 1.00390625, float32(math.Inf(-1)), 70000} {
		src = binary.LittleEndian.AppendUint32(src, math.Float32bits(v))
	}
	bf := make([]byte, 8)
	if err := cast.Convert(bf, dtype.BF16, src, dtype.F32); err != nil {
		log.Fatal(err)
	}
	hf := make([]byte, 8)
	if err := cast.Convert(hf, dtype.F16, src, dtype.F32); err != nil {
		log.Fatal(err)
	}
	for i := range 4 {
		fmt.Printf("%#04x %#04x\n", binary.LittleEndian.Uint16(bf[2*i:]), binary.LittleEndian.Uint16(hf[2*i:]))
	}
	fmt.Println(cast.Supported(dtype.F32, dtype.I8))
	// Output:
	// 0x3f80 0x3c00
	// 0x3f80 0x3c04
	// 0xff80 0xfc00
	// 0x4789 0x7c00
	// false
}
