// Package auth holds what proves that a rank belongs to its group: the
// group secret, the keys derived from it for one run, and the TLS settings
// of the connections between ranks.
//
// # The group secret
//
// A Secret is the one credential of a group's ranks: every rank of a run is
// given the same one (ReadSecretFile, SecretFile and the environment
// variable WEIGHTCAST_SECRET_FILE), and nothing else is trusted. From it,
// RunKeys derives with HKDF-SHA256 (RFC 5869) one Keys per run, with the
// group name and the run id as HKDF info, so keys of one run are worthless in
// any other run and the secret itself never travels:
//
//   - the record key MACs every value a rank writes to the rendezvous store
//     (HMAC-SHA256 over the store key and the value; SignRecord,
//     OpenRecord);
//   - the handshake key proves, in a challenge and response, that each end
//     of a connection holds the secret: each side sends a fresh nonce, and
//     each proves itself with an HMAC-SHA256 over the protocol, its version,
//     the group, the run id, both ranks, the world size, both nonces, the
//     side's role and, on TLS, a channel binding (Prove, Verify), so neither
//     a stranger nor a replay of an earlier handshake gets in;
//   - the bucket key is the key of the per-bucket MAC (BucketKey), a keyed
//     BLAKE3 built elsewhere;
//   - the message key MACs every message of the metadata bus (bucket
//     metadata, commit messages): HMAC-SHA256 over the message's sequence
//     number and its bytes (MessageMAC, VerifyMessage).
//
// MACs are compared in constant time (crypto/hmac.Equal). A failed check is
// an error wrapping ErrFailed ("authentication failed").
//
// # TLS
//
// TLS holds one certificate authority and this rank's certificate, and
// makes the tls.Config of both ends of a mutual-TLS connection on TLS 1.3:
// the server asks for and verifies the client's certificate, the client
// verifies the server's against the name it dialed. TLSBinding derives the
// channel binding that ties a handshake proof to one TLS connection, so a
// relay in the middle cannot forward a proof.
package auth
