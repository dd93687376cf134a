// Package wire holds the wire format of the metadata bus: what the root
// publishes for each bucket before its bytes move (BucketMeta, its
// entries and the description of the round's source), the commit message
// that ends a round (EncodeCommit, DecodeCommit), the signature a message
// carries when the group has a secret (Seal, Open), and the limits a
// receiver holds every message to. docs/protocol.md gives the same format
// in prose; package stages publishes, receives and checks it.
//
// It is a package of its own so that what travels between ranks is read,
// changed and fuzzed in one place, apart from the stages that move it, and
// so that a program that only decodes metadata need not link the stages.
package wire
