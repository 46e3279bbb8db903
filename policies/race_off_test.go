//go:build !race

package policies

const raceEnabled = false
