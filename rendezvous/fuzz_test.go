package rendezvous

import (
	"encoding/json"
	"testing"
)

// FuzzRecords feeds arbitrary values to the decoders of what ranks read
// from etcd (a rank's liveness record, rank 0's run record, the abort
// record): they must never panic, and what they accept must keep its
// limits and survive a round trip.
func FuzzRecords(f *testing.F) {
	uid := make([]byte, 128)
	root, _ := json.Marshal(rootRecord{WorldSize: 4, UniqueID: uid})
	rank, _ := json.Marshal(rankRecord{WorldSize: 4, Endpoints: map[string]string{"meta": "10.0.0.1:5555"}, Host: "h", PID: 7})
	abort, _ := json.Marshal(abortRecord{Kind: "world-size-mismatch", By: 2, Key: "/weightcast/g/r/root", Ranks: []int{0, 2}, Detail: "x"})
	for _, seed := range [][]byte{root, rank, abort, []byte(`{"world_size":-1}`), []byte(`{"unique_id":"AAAA"}`), []byte(`{"ranks":[1,2,3]`), []byte(`null`)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeRootRecord(b); err == nil {
			if len(r.UniqueID) != 128 || r.WorldSize < 1 {
				t.Fatalf("accepted root record %+v", r)
			}
			again, _ := json.Marshal(r)
			if _, err := decodeRootRecord(again); err != nil {
				t.Fatalf("root record does not survive a round trip: %v", err)
			}
		}
		if r, err := decodeRankRecord(b); err == nil {
			if r.WorldSize < 1 || len(r.Endpoints) > maxEndpoints {
				t.Fatalf("accepted rank record %+v", r)
			}
			_ = r.holder()
		}
		if r, err := decodeAbortRecord(b); err == nil {
			if len(r.Ranks) > maxRecordList || len(r.Detail) > maxDetail {
				t.Fatalf("accepted abort record with %d ranks and %d bytes of detail", len(r.Ranks), len(r.Detail))
			}
			_ = rankList(r.Ranks)
		}
	})
}
