package source

// What the external tests (package source_test) take from the package.
var (
	CheckDescription = checkDescription
	FadviseDontNeed  = fadviseDontNeed
)

const (
	FadviseSupported = fadviseSupported
	MaxDescription   = maxDescription
)

// ReadAheadOf says whether c reads ahead, and how many advice requests its
// read-ahead made and up to which virtual offset.
func ReadAheadOf(c *Checkpoint) (on bool, requests, advised int64) {
	if c.ra == nil {
		return false, 0, 0
	}
	c.ra.mu.Lock()
	defer c.ra.mu.Unlock()
	return true, c.ra.requests, c.ra.advised
}
