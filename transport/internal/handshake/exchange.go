package handshake

import (
	"fmt"
	"io"

	"github.com/weightcast/weightcast/auth"
)

// judge is this end's verdict on the other's hello: the protocol
// version, the group, the world size, the secret (both or neither), then
// check.
func (s Side) judge(p Protocol, h Hello, check Check) verdict {
	switch {
	case h.Version != p.Version:
		return reject("the other end speaks %s protocol version %d, this one %d: run the same weightcast release on every rank", p.Name, h.Version, p.Version)
	case h.Group != s.Group:
		return reject("rank %d belongs to group %q, rank %d to group %q: start every rank of a group with the same group name", h.Rank, h.Group, s.Rank, s.Group)
	case h.World != s.World:
		return reject("rank %d says the group has %d ranks, rank %d says %d: start every rank with the same world size", h.Rank, h.World, s.Rank, s.World)
	case h.Secret && s.Keys == nil:
		return authFailed("rank %d has a group secret and rank %d has none: give every rank the same secret, or none", h.Rank, s.Rank)
	case !h.Secret && s.Keys != nil:
		return authFailed("rank %d has no group secret and rank %d has one: give every rank the same secret, or none", h.Rank, s.Rank)
	}
	if why := check(h); why != "" {
		return reject("%s", why)
	}
	return accept
}

// transcript is what both ends' proofs cover.
func transcript(p Protocol, initiator, responder Side, in, re auth.Nonce, binding []byte) auth.Transcript {
	return auth.Transcript{Protocol: p.Name, Version: uint32(p.Version), Initiator: initiator.Rank, Responder: responder.Rank,
		World: initiator.World, InitiatorNonce: in, ResponderNonce: re, Binding: binding}
}

// peerSide is the other end as its hello describes it, for transcripts.
func peerSide(h Hello) Side { return Side{Group: h.Group, Rank: h.Rank, World: h.World} }

// Dial runs the initiator's side of the handshake on c, the connection
// this end opened, and returns the responder's hello. The caller bounds
// it with c's deadlines. A refusal by either end is a *Rejected; bytes
// that are not this protocol's hello wrap ErrNotPeer; a message that
// breaks the format wraps ErrMalformed; anything else is c's I/O error.
func Dial(c io.ReadWriter, p Protocol, me Side, check Check) (Hello, error) {
	nonce := auth.NewNonce()
	if _, err := c.Write(me.hello(p, nonce)); err != nil {
		return Hello{}, err
	}
	h, err := readHello(c, p)
	if err != nil {
		return h, err
	}
	theirs := accept
	if h.Version == p.Version {
		if theirs, err = readVerdict(c); err != nil {
			return h, unexpected(err)
		}
	}
	if !theirs.ok() {
		return h, theirs.theirs()
	}
	mine := me.judge(p, h, check)
	both := me.Keys != nil && h.Secret
	t := transcript(p, me, peerSide(h), nonce, h.Nonce, me.Binding)
	if both {
		// Read the proof even to refuse: a connection closed with unread
		// bytes is reset, and the other end could lose the verdict.
		var proof [auth.KeySize]byte
		if _, err := io.ReadFull(c, proof[:]); err != nil {
			return h, unexpected(err)
		}
		if mine.ok() && me.Keys.Verify(auth.Responder, t, proof[:]) != nil {
			mine = authFailed("rank %d did not prove that it holds this run's group secret (another secret, or a replayed or relayed handshake)", h.Rank)
		}
	}
	out := mine.append(nil)
	if mine.ok() && both {
		proof := me.Keys.Prove(auth.Initiator, t)
		out = append(out, proof[:]...)
	}
	if _, err := c.Write(out); err != nil && mine.ok() {
		return h, err
	}
	if !mine.ok() {
		return h, mine.mine()
	}
	final, err := readVerdict(c)
	if err != nil {
		return h, unexpected(err)
	}
	if !final.ok() {
		return h, final.theirs()
	}
	return h, nil
}

// Accept runs the responder's side of the handshake on c, a connection
// this end accepted, and returns the initiator's hello. Errors are as
// Dial's. A caller that waits for a particular peer treats every error as
// that connection's failure only: until the handshake completes, the
// other end has proved nothing.
func Accept(c io.ReadWriter, p Protocol, me Side, check Check) (Hello, error) {
	h, err := readHello(c, p)
	if err != nil {
		return h, err
	}
	nonce := auth.NewNonce()
	mine := me.judge(p, h, check)
	both := me.Keys != nil && h.Secret
	t := transcript(p, peerSide(h), me, h.Nonce, nonce, me.Binding)
	out := mine.append(me.hello(p, nonce))
	if mine.ok() && both {
		proof := me.Keys.Prove(auth.Responder, t)
		out = append(out, proof[:]...)
	}
	if _, err := c.Write(out); err != nil && mine.ok() {
		return h, err
	}
	if !mine.ok() {
		return h, mine.mine()
	}
	theirs, err := readVerdict(c)
	if err != nil {
		return h, unexpected(err)
	}
	if !theirs.ok() {
		return h, theirs.theirs()
	}
	final := accept
	if both {
		var proof [auth.KeySize]byte
		if _, err := io.ReadFull(c, proof[:]); err != nil {
			return h, unexpected(err)
		}
		if err := me.Keys.Verify(auth.Initiator, t, proof[:]); err != nil {
			final = authFailed("rank %d did not prove that it holds this run's group secret (another secret, or a replayed or relayed handshake)", h.Rank)
		}
	}
	if _, err := c.Write(final.append(nil)); err != nil && final.ok() {
		return h, err
	}
	if !final.ok() {
		return h, final.mine()
	}
	return h, nil
}

// String describes a hello for messages.
func (h Hello) String() string {
	return fmt.Sprintf("rank %d of group %q (world size %d, version %d)", h.Rank, h.Group, h.World, h.Version)
}

// Refuse answers the initiator of a connection with a refusal for reason,
// in place of a handshake: a hello that says nothing of this end (no
// group, rank or nonce) and a verdict refusing the initiator's hello, so
// that its Dial fails with a *Rejected saying reason. A responder uses it
// where it cannot run the handshake at all, such as a rank with TLS
// answering a plain connection.
func Refuse(w io.Writer, p Protocol, reason string) error {
	_, err := w.Write(reject("%s", reason).append(Side{}.hello(p, auth.Nonce{})))
	return err
}
