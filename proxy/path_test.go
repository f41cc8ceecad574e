package proxy

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPathOfBoundedAndInert(t *testing.T) {
	require.Equal(t, "/v1/chat/completions", pathOf([]byte("/v1/chat/completions")))
	require.Equal(t, "/api/show", pathOf([]byte("/api/show")))
	require.Equal(t, "/a%20b/%1B[31m/%C3%A9/%2F", pathOf([]byte("/a b/\x1b[31m/\xc3\xa9/%2F")))
	long := pathOf([]byte("/" + strings.Repeat("x", 500)))
	require.Equal(t, "/"+strings.Repeat("x", MaxPathBytes-1)+"...", long)
	require.Zero(t, testing.AllocsPerRun(100, func() { _ = pathOf([]byte("/v1/messages")) }))
}
