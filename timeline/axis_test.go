package timeline

import (
	"strings"
	"testing"
)

func TestNiceStep(t *testing.T) {
	for _, tc := range []struct{ raw, want float64 }{
		{0.7, 1}, {1, 1}, {1.1, 2}, {3, 5}, {7, 10}, {42, 50}, {0.013, 0.02}, {250, 500},
	} {
		if got := niceStep(tc.raw); got != tc.want {
			t.Errorf("niceStep(%v) = %v, want %v", tc.raw, got, tc.want)
		}
	}
}

func TestAxisTicks(t *testing.T) {
	for _, tc := range []struct {
		span     float64
		maxTicks int
		want     string
	}{
		{338750, 11, "0 ms,50 ms,100 ms,150 ms,200 ms,250 ms,300 ms"},
		{815, 9, "0 µs,100 µs,200 µs,300 µs,400 µs,500 µs,600 µs,700 µs,800 µs"},
		{2500, 10, "0.0 ms,0.5 ms,1.0 ms,1.5 ms,2.0 ms,2.5 ms"},
		{12.5e6, 5, "0 s,5 s,10 s"},
		{0, 5, "0.0 µs,0.2 µs,0.4 µs,0.6 µs,0.8 µs,1.0 µs"},
	} {
		ticks, unit, dec := axisTicks(tc.span, tc.maxTicks)
		var labels []string
		for _, tk := range ticks {
			labels = append(labels, formatTick(tk, unit, dec))
		}
		if got := strings.Join(labels, ","); got != tc.want {
			t.Errorf("axisTicks(%v, %d) = %s, want %s", tc.span, tc.maxTicks, got, tc.want)
		}
		if len(ticks)-1 > tc.maxTicks {
			t.Errorf("axisTicks(%v, %d) made %d intervals", tc.span, tc.maxTicks, len(ticks)-1)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for _, tc := range []struct {
		us   float64
		want string
	}{
		{0, "0.0 µs"}, {999.94, "999.9 µs"}, {1000, "1.00 ms"}, {33554.432, "33.55 ms"}, {2.5e6, "2.500 s"},
	} {
		if got := formatDuration(tc.us); got != tc.want {
			t.Errorf("formatDuration(%v) = %q, want %q", tc.us, got, tc.want)
		}
	}
}

func TestWrap(t *testing.T) {
	got := wrap("aaa bbb ccc "+strings.Repeat("x", 45), 20)
	want := []string{"aaa bbb ccc", strings.Repeat("x", 20), strings.Repeat("x", 20), "xxxxx"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("wrap = %q, want %q", got, want)
	}
}
