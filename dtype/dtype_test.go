package dtype

import "testing"

func TestParseRoundTrip(t *testing.T) {
	for _, d := range All() {
		got, err := Parse(d.String())
		if err != nil || got != d {
			t.Fatalf("Parse(%q) = %v, %v; want %v", d.String(), got, err, d)
		}
		b, err := d.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back DType
		if err := back.UnmarshalText(b); err != nil || back != d {
			t.Fatalf("text round trip of %v gave %v, %v", d, back, err)
		}
		if d.Size() == 0 {
			t.Fatalf("%v has size 0", d)
		}
	}
	if len(All()) != 15 {
		t.Fatalf("want the 15 safetensors dtypes, have %d", len(All()))
	}
}

func TestParseUnknown(t *testing.T) {
	if _, err := Parse("F128"); err == nil {
		t.Fatal("Parse(F128) succeeded")
	}
	if _, err := Invalid.MarshalText(); err == nil {
		t.Fatal("Invalid.MarshalText succeeded")
	}
}

func TestBytes(t *testing.T) {
	cases := []struct {
		d     DType
		shape []int64
		want  int64
		bad   bool
	}{
		{BF16, []int64{4096, 4096}, 4096 * 4096 * 2, false},
		{F32, nil, 4, false},
		{F32, []int64{0, 7}, 0, false},
		{F64, []int64{-1}, 0, true},
		{F64, []int64{1 << 40, 1 << 40}, 0, true},
		{Invalid, []int64{1}, 0, true},
	}
	for _, c := range cases {
		got, err := c.d.Bytes(c.shape)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("%v.Bytes(%v) = %d, %v; want %d, bad=%v", c.d, c.shape, got, err, c.want, c.bad)
		}
	}
}
