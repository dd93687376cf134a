// Package dtype names the element types that safetensors knows and says how
// wide each one is.
package dtype
