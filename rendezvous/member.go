package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/weightcast/weightcast/auth"
)

// member is what a joiner and the Group it becomes share: one rank's view
// of one run, and how it writes and reads the run's records. With a group
// secret (JoinOptions.Auth) every value a rank writes under the run's
// prefix is signed (auth.Keys.SignRecord) and every value it reads is
// checked; without one, values are stored as they are.
type member struct {
	store Store
	opts  JoinOptions
	keys  keys
}

func (m *member) errorf(sentinel error, key string, ranks []int, format string, args ...any) *Error {
	return &Error{Group: m.opts.Group, RunID: m.opts.RunID, Rank: m.opts.Rank, Key: key, Ranks: ranks,
		Err: sentinel, Detail: fmt.Sprintf(format, args...)}
}

// seal is value as it is written under key: signed with a secret, as it
// is without.
func (m *member) seal(key string, value []byte) []byte {
	return m.opts.Auth.SignRecord(key, value)
}

// open checks a record read from key and returns its value: a
// *auth.RecordError for a record that is not signed with the run's keys,
// or, without a secret, for one that is signed.
func (m *member) open(key string, rec []byte) ([]byte, error) {
	return m.opts.Auth.OpenRecord(key, rec)
}

// maxReplace bounds how often createRecord replaces a record that does not
// verify before it gives up.
const maxReplace = 3

// createRecord creates key, a key of the run, with value if it does not
// exist. A record already there that verifies was written by a rank of
// this run: created is false and existing its value. One that does not
// verify was written by a process without the run's secret (squatting on
// a rank's key, say): it is deleted and the create tried again.
func (m *member) createRecord(ctx context.Context, key string, value []byte, leased bool) (created bool, existing []byte, err error) {
	create := m.store.Create
	if leased {
		create = m.store.CreateLeased
	}
	rec := m.seal(key, value)
	for range maxReplace {
		created, raw, err := create(ctx, key, rec)
		if err != nil || created {
			return created, nil, err
		}
		v, oerr := m.open(key, raw)
		if oerr == nil {
			return false, v, nil
		}
		if _, err := m.store.DeleteIf(ctx, key, raw); err != nil {
			return false, nil, err
		}
	}
	return false, nil, m.errorf(ErrAuth, key, nil, "a record that is not signed with this run's secret took this key %d times in a row; something without the group secret keeps writing to the run's keys", maxReplace)
}

// refusedError ends a wait for a record during which the key held only
// records that do not verify.
type refusedError struct {
	rec   *auth.RecordError // the last record refused
	cause error             // why the wait ended
}

func (e *refusedError) Error() string {
	return fmt.Sprintf("%v (%v)", e.rec, e.cause)
}

func (e *refusedError) Unwrap() []error { return []error{e.rec, e.cause} }

// waitRecord waits until key holds a record that verifies and returns its
// value. A record that does not verify is waited past (its rank replaces
// it); if the wait ends while the key holds one, the error is a
// *refusedError.
func (m *member) waitRecord(ctx context.Context, key string) ([]byte, error) {
	var refused *auth.RecordError
	for {
		raw, err := m.store.Wait(ctx, key)
		if err == nil {
			v, oerr := m.open(key, raw)
			if oerr == nil {
				return v, nil
			}
			errors.As(oerr, &refused)
			_, _, err = m.store.WaitChange(ctx, key, raw)
		}
		if err != nil {
			if refused != nil && ctx.Err() != nil {
				return nil, &refusedError{rec: refused, cause: err}
			}
			return nil, err
		}
	}
}

// rankList is what rankRecords finds at the keys prefix+rank.
type rankListing struct {
	valid map[int][]byte // values of the records that verify
	raw   map[int][]byte // every record, as stored
	// refused are the ranks whose key holds a record that does not
	// verify; unsigned is true when none of those carries a signature.
	refused  []int
	unsigned bool
}

// rankRecords reads the record of every rank whose key is prefix+rank.
func (m *member) rankRecords(ctx context.Context, prefix string) (rankListing, error) {
	l := rankListing{valid: map[int][]byte{}, raw: map[int][]byte{}, unsigned: true}
	all, err := m.store.List(ctx, prefix)
	if err != nil {
		return l, err
	}
	for r := range m.opts.WorldSize {
		key := prefix + strconv.Itoa(r)
		rec, ok := all[key]
		if !ok {
			continue
		}
		l.raw[r] = rec
		v, err := m.open(key, rec)
		if err == nil {
			l.valid[r] = v
			continue
		}
		l.refused = append(l.refused, r)
		var re *auth.RecordError
		l.unsigned = l.unsigned && errors.As(err, &re) && re.Unsigned
	}
	return l, nil
}

// missingRanks lists the ranks in [0, n) with no record that verifies at
// prefix+rank, and what rankRecords found.
func (m *member) missingRanks(ctx context.Context, prefix string) ([]int, rankListing, error) {
	l, err := m.rankRecords(ctx, prefix)
	if err != nil {
		return nil, l, err
	}
	var missing []int
	for r := range m.opts.WorldSize {
		if _, ok := l.valid[r]; !ok {
			missing = append(missing, r)
		}
	}
	return missing, l, nil
}

// authError is the error of records that do not verify: subject says
// which, with its verb ("rank 0's record is"), ranks whose they are,
// unsigned whether they carry no signature at all.
func (m *member) authError(key string, ranks []int, subject string, unsigned bool) *Error {
	who := "its rank"
	if len(ranks) > 0 {
		who = rankList(ranks)
	}
	was := "was"
	if len(ranks) > 1 {
		was = "were"
	}
	if m.opts.Auth == nil {
		return m.errorf(ErrAuth, key, ranks, "%s signed with a group secret, and this rank has none: give this rank the secret %s %s started with, or give no rank a secret", subject, who, was)
	}
	how := "not signed with this rank's group secret"
	if unsigned {
		how = "not signed at all, and this rank has a group secret"
	}
	return m.errorf(ErrAuth, key, ranks, "%s %s: %s %s started with another secret or none, or a process without the secret wrote it; give every rank of the run the same secret", subject, how, who, was)
}

// refusedAuthError is authError for the key of a wait that ended on a
// record that does not verify.
func (m *member) refusedAuthError(ref *refusedError) *Error {
	key, ranks := ref.rec.Key, m.rankOfKey(ref.rec.Key)
	subject := fmt.Sprintf("the record at key %q is", key)
	if len(ranks) == 1 {
		subject = fmt.Sprintf("rank %d's record is", ranks[0])
	}
	return m.authError(key, ranks, subject, ref.rec.Unsigned)
}

// rankOfKey returns the rank a key of the run belongs to (its rank
// record, marker or data; rank 0 for the root record), or nil.
func (m *member) rankOfKey(key string) []int {
	rest, ok := strings.CutPrefix(key, m.keys.runPrefix())
	if !ok {
		return nil
	}
	if rest == "root" {
		return []int{0}
	}
	parts := strings.Split(rest, "/")
	field := -1
	switch {
	case len(parts) >= 2 && (parts[0] == "ranks" || parts[0] == "seen" || parts[0] == "join" || parts[0] == "data"):
		field = 1
	case len(parts) == 3 && parts[0] == "barrier":
		field = 2
	}
	if field < 0 {
		return nil
	}
	if r, err := strconv.Atoi(parts[field]); err == nil && r >= 0 && r < m.opts.WorldSize {
		return []int{r}
	}
	return nil
}
