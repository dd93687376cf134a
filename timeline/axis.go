package timeline

import (
	"math"
	"strconv"
)

// timeUnit is a unit for time labels.
type timeUnit struct {
	name string  // "µs", "ms", "s"
	us   float64 // microseconds per unit
}

var (
	unitUS = timeUnit{"µs", 1}
	unitMS = timeUnit{"ms", 1e3}
	unitS  = timeUnit{"s", 1e6}
)

// unitFor picks the unit that labels a span of spanUS microseconds with
// small numbers: µs below 1 ms, ms below 1 s, s above.
func unitFor(spanUS float64) timeUnit {
	switch {
	case spanUS < 1e3:
		return unitUS
	case spanUS < 1e6:
		return unitMS
	default:
		return unitS
	}
}

// niceStep returns the smallest of 1, 2 or 5 times a power of ten that is
// at least raw (raw > 0).
func niceStep(raw float64) float64 {
	exp := math.Floor(math.Log10(raw))
	base := math.Pow(10, exp)
	for _, m := range []float64{1, 2, 5, 10} {
		if s := m * base; s >= raw*(1-1e-9) {
			return s
		}
	}
	return 10 * base
}

// axisTicks returns tick positions (microseconds from 0) for a span of
// spanUS microseconds with at most maxTicks intervals, the step between them,
// and the unit and decimals to label them with.
func axisTicks(spanUS float64, maxTicks int) (ticks []float64, unit timeUnit, decimals int) {
	if spanUS <= 0 {
		spanUS = 1
	}
	maxTicks = max(1, maxTicks)
	unit = unitFor(spanUS)
	step := niceStep(spanUS / unit.us / float64(maxTicks)) // in units
	decimals = max(0, int(-math.Floor(math.Log10(step)+1e-9)))
	for i := 0; ; i++ {
		v := float64(i) * step
		if v*unit.us > spanUS*(1+1e-9) {
			break
		}
		ticks = append(ticks, v*unit.us)
	}
	return ticks, unit, decimals
}

// formatTick labels a tick at us microseconds.
func formatTick(us float64, unit timeUnit, decimals int) string {
	return strconv.FormatFloat(us/unit.us, 'f', decimals, 64) + " " + unit.name
}

// formatDuration writes a duration in microseconds with a unit chosen from
// its size and a fixed number of decimals, so output is deterministic.
func formatDuration(us float64) string {
	switch a := math.Abs(us); {
	case a < 1e3:
		return strconv.FormatFloat(us, 'f', 1, 64) + " µs"
	case a < 1e6:
		return strconv.FormatFloat(us/1e3, 'f', 2, 64) + " ms"
	default:
		return strconv.FormatFloat(us/1e6, 'f', 3, 64) + " s"
	}
}
