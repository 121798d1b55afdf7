package inbox

import "fmt"

// The stages that ask whether a delivery is what its producers write
// (stages.go): its id in their format, its record authenticated. Each is
// in the list only when configured.

// checkID refuses an id Config.CheckID says is not in the issued format.
func checkID(in *Inbox, d *delivery) string {
	if err := in.cfg.CheckID(d.id); err != nil {
		return fmt.Sprintf("message id %q is not in the issued format: %v", d.id, err)
	}
	return ""
}

// verify refuses a record Config.Verify does not authenticate: a forgery
// under a fresh id never reaches the inbox row.
func verify(in *Inbox, d *delivery) string {
	if err := in.cfg.Verify(d.msg); err != nil {
		return fmt.Sprintf("not authenticated: %v", err)
	}
	return ""
}
