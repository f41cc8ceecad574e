//go:build !unix

package prefix

func cpuTime() int64 { return 0 }
