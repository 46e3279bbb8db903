//go:build race

package deploy_test

// raceEnabled: the test runs with -race, so costgate is built with -race
// too, from the same compiled packages.
const raceEnabled = true
