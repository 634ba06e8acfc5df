// Package cronkey names the key of a cronguard entry, for cronguard and
// for the programs that read it back (the chaos run): it must stay byte for
// byte what running deployments use.
package cronkey

// Key is the lockkit key of the cronguard entry named name: "cron:<name>".
func Key(name string) string { return "cron:" + name }
