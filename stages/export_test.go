package stages

// What the external tests (package stages_test, which use the real sinks
// and sources of packages sink and source) take from the package and from
// its in-package tests.
var (
	Castable      = castable
	Convert16     = convert16
	WantQuantized = wantQuantized
	ScaleBytes    = scaleBytes
)
