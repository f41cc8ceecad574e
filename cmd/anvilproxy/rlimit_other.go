//go:build !unix

package main

import "go.uber.org/zap"

// raiseFileLimit returns 0 (no client-connection bound): this platform has
// no open-file limit to read or raise.
func raiseFileLimit(*zap.Logger) int { return 0 }
