package sim

// ReferenceLengths are the completion lengths of the reference run the
// simulator is calibrated to (six agent-style answers with max_tokens 8192,
// each ending by itself with finish_reason "stop"), sorted. Natural lengths
// are drawn between them.
var ReferenceLengths = []int{274, 281, 321, 433, 455, 519}

// drawLength draws a natural completion length from the sorted sample
// lengths: the sample's quantile function, linearly interpolated, at a
// uniform point u in [0, 1). So every length lies within the sample's range
// and the draws follow its distribution (for the reference sample: 274–519,
// median ~380, mean ~377). rng makes it deterministic.
func drawLength(lengths []int, rng *uint64) int {
	if len(lengths) == 1 {
		return lengths[0]
	}
	u := float64(splitmix(rng)>>11) / (1 << 53) // uniform in [0, 1)
	x := u * float64(len(lengths)-1)
	i := int(x)
	lo, hi := float64(lengths[i]), float64(lengths[i+1])
	return int(lo + (x-float64(i))*(hi-lo) + 0.5)
}
