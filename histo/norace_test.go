//go:build !race

package histo_test

const raceEnabled = false
