package auth

import "crypto/rand"

// NonceSize is the size of a handshake nonce.
const NonceSize = 32

// Nonce is one side's fresh random challenge in a handshake.
type Nonce [NonceSize]byte

// NewNonce returns a fresh random nonce.
func NewNonce() Nonce {
	var n Nonce
	rand.Read(n[:]) // never fails (crypto/rand)
	return n
}
