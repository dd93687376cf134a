package wire

import (
	"bytes"
	"strings"
	"testing"
)

// TestChecksumWireForm: the checksum goes on the wire as exactly 16
// lower-case hex digits, leading zeros included, and the decoder also
// takes the short form older senders wrote; anything else is refused.
func TestChecksumWireForm(t *testing.T) {
	m := &BucketMeta{Seq: 4, Length: 0, IsLast: true, Checksum: 0x244ddcbdf096340, HasChecksum: true}
	b, err := EncodeMeta(m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(`"checksum":"0244ddcbdf096340"`)) {
		t.Fatalf("encoded %s, want the checksum as 16 hex digits", b)
	}
	for _, s := range []string{"0244ddcbdf096340", "244ddcbdf096340", "244DDCBDF096340"} {
		got, err := DecodeMeta(bytes.Replace(b, []byte("0244ddcbdf096340"), []byte(s), 1))
		if err != nil || !got.HasChecksum || got.Checksum != m.Checksum {
			t.Fatalf("checksum %q: decoded %+v, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "0x244ddcbdf096340", "00244ddcbdf096340", "+244ddcbdf096340", "244ddcbdf09634g"} {
		_, err := DecodeMeta(bytes.Replace(b, []byte("0244ddcbdf096340"), []byte(s), 1))
		if err == nil || !strings.Contains(err.Error(), "malformed checksum") {
			t.Fatalf("checksum %q: want a malformed checksum error, got %v", s, err)
		}
	}
}
