//go:build !race

package deploy_test

// raceEnabled: the test runs without -race, and so is costgate built.
const raceEnabled = false
