package rendezvous

import (
	"encoding/json"
	"fmt"
)

// Limits on the rendezvous values a rank decodes: a value past one is
// rejected as malformed rather than trusted, since another program (or a
// different weightcast version) could have written it.
const (
	maxRecord     = 64 << 10 // bytes of one value
	maxEndpoints  = 64       // endpoints one rank publishes
	maxRecordList = 1 << 16  // ranks named in an abort record
	maxDetail     = 16 << 10 // bytes of an abort record's detail
)

// decodeRankRecord decodes a rank's liveness value.
func decodeRankRecord(b []byte) (rankRecord, error) {
	var rec rankRecord
	if err := decodeRecord(b, &rec); err != nil {
		return rec, err
	}
	switch {
	case rec.WorldSize < 1:
		return rec, fmt.Errorf("world size %d", rec.WorldSize)
	case len(rec.Endpoints) > maxEndpoints:
		return rec, fmt.Errorf("%d endpoints, more than %d", len(rec.Endpoints), maxEndpoints)
	}
	return rec, nil
}

// decodeRootRecord decodes rank 0's record of the run.
func decodeRootRecord(b []byte) (rootRecord, error) {
	var rec rootRecord
	if err := decodeRecord(b, &rec); err != nil {
		return rec, err
	}
	switch {
	case rec.WorldSize < 1:
		return rec, fmt.Errorf("world size %d", rec.WorldSize)
	case len(rec.UniqueID) != 128:
		return rec, fmt.Errorf("unique id of %d bytes, want 128", len(rec.UniqueID))
	}
	return rec, nil
}

// decodeAbortRecord decodes the run's record of its first failure.
func decodeAbortRecord(b []byte) (abortRecord, error) {
	var rec abortRecord
	if err := decodeRecord(b, &rec); err != nil {
		return rec, err
	}
	switch {
	case len(rec.Ranks) > maxRecordList:
		return rec, fmt.Errorf("%d ranks named, more than %d", len(rec.Ranks), maxRecordList)
	case len(rec.Detail) > maxDetail:
		return rec, fmt.Errorf("detail of %d bytes, more than %d", len(rec.Detail), maxDetail)
	}
	return rec, nil
}

func decodeRecord(b []byte, v any) error {
	if len(b) > maxRecord {
		return fmt.Errorf("%d bytes, more than the %d a record may have", len(b), maxRecord)
	}
	return json.Unmarshal(b, v)
}
