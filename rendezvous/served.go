package rendezvous

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/weightcast/weightcast/auth"
)

// servedRunKeys is the pseudo run id whose keys sign the served run id's
// record: it holds a '/', so no real run (ValidName) shares its keys.
const servedRunKeys = "/served-run"

// ServedRunKey is the key under which a rank 0 that serves the rendezvous
// itself (torchrun style, MASTER_ADDR:MASTER_PORT) publishes the run id it
// made up for the run: that server lives exactly as long as the run, so
// it is the run's identity, and a launch needs no run id of its own.
func ServedRunKey(group string) string { return keys{group: group}.groupPrefix() + "served-run" }

// NewRunID makes up a fresh run id: "served-" and 16 random hex digits.
func NewRunID() string {
	var b [8]byte
	rand.Read(b[:])
	return "served-" + hex.EncodeToString(b[:])
}

// PublishServedRun writes runID under ServedRunKey(group), for the other
// ranks to read with AwaitServedRun; rank 0 calls it on the rendezvous it
// serves, before it joins. With a secret the record is signed (a record
// that does not verify, or that names another run, is replaced: only this
// rank 0 writes the key of the server it started).
func PublishServedRun(ctx context.Context, store Store, group, runID string, secret *auth.Secret) error {
	if !ValidName(group) || !ValidName(runID) || runID == "owner" {
		return &Error{Group: group, RunID: runID, Err: ErrInvalid, Detail: fmt.Sprintf("group %q and run id %q must be names of at most 256 bytes without '/', spaces or control characters", group, runID)}
	}
	k, err := servedKeys(group, secret)
	if err != nil {
		return err
	}
	key := ServedRunKey(group)
	rec := k.SignRecord(key, []byte(runID))
	for range maxReplace {
		created, raw, err := store.Create(ctx, key, rec)
		if err != nil {
			return fmt.Errorf("rendezvous: group %q: publishing the served run id at key %q: %w", group, key, err)
		}
		if created {
			return nil
		}
		if v, err := k.OpenRecord(key, raw); err == nil && string(v) == runID {
			return nil
		}
		if _, err := store.DeleteIf(ctx, key, raw); err != nil {
			return fmt.Errorf("rendezvous: group %q: replacing what another writer left at key %q: %w", group, key, err)
		}
	}
	return &Error{Group: group, RunID: runID, Key: key, Err: ErrTampered,
		Detail: fmt.Sprintf("another writer kept replacing the served run id %d times in a row; something other than this rank 0 writes to the rendezvous it serves: keep its port to the ranks, or give every rank a group secret", maxReplace)}
}

// AwaitServedRun waits, up to timeout, for the run id that the rank 0
// serving this rendezvous published (PublishServedRun) and returns it;
// rank is the caller's, for its errors.
// With a secret only a record signed with it is taken; others are waited
// past. It fails with an *Error wrapping ErrTimeout when none comes, and
// with ErrAuth when the key held only records that do not verify.
func AwaitServedRun(ctx context.Context, store Store, group string, rank int, secret *auth.Secret, timeout time.Duration) (string, error) {
	if !ValidName(group) {
		return "", &Error{Group: group, Rank: rank, Err: ErrInvalid, Detail: fmt.Sprintf("group name %q must be non-empty, without '/' or spaces", group)}
	}
	k, err := servedKeys(group, secret)
	if err != nil {
		return "", err
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	key := ServedRunKey(group)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var refused error
	for {
		raw, err := store.Wait(wctx, key)
		if err == nil {
			v, oerr := k.OpenRecord(key, raw)
			if oerr == nil && ValidName(string(v)) && string(v) != "owner" {
				return string(v), nil
			}
			if oerr == nil {
				oerr = fmt.Errorf("%q is not a run id", v)
			}
			refused = oerr
			_, _, err = store.WaitChange(wctx, key, raw)
		}
		if err == nil {
			continue
		}
		switch {
		case ctx.Err() != nil:
			return "", ctx.Err()
		case refused != nil && wctx.Err() != nil:
			return "", &Error{Group: group, Rank: rank, Key: key, Ranks: []int{0}, Err: ErrAuth,
				Detail: fmt.Sprintf("the run id at the rendezvous rank 0 serves does not verify (%v): rank 0 was started with another group secret or none, or another process wrote it; give every rank the same secret", refused)}
		case wctx.Err() != nil:
			return "", &Error{Group: group, Rank: rank, Key: key, Ranks: []int{0}, Err: ErrTimeout,
				Detail: fmt.Sprintf("rank 0 did not publish the run's id within %v on the rendezvous it serves; start rank 0 with the same group (and, if it was given one, give every rank the same run id)", timeout)}
		default:
			return "", &Error{Group: group, Rank: rank, Key: key, Err: err, Detail: "reading the served run id failed"}
		}
	}
}

// servedKeys are the keys that sign the served run id with secret; nil
// without one.
func servedKeys(group string, secret *auth.Secret) (*auth.Keys, error) {
	if secret == nil {
		return nil, nil
	}
	k, err := secret.RunKeys(group, servedRunKeys)
	if err != nil {
		return nil, errors.Join(&Error{Group: group, Err: ErrInvalid, Detail: "deriving the served run id's keys"}, err)
	}
	return k, nil
}
