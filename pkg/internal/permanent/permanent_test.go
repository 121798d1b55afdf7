package permanent

import (
	"errors"
	"fmt"
	"testing"
)

// TestMark: a marked error stays itself (its text, errors.Is) and is found
// through wrapping; an unmarked one and nil are not permanent.
func TestMark(t *testing.T) {
	cause := errors.New("schema version 9 is unknown")
	err := fmt.Errorf("decoding: %w", Wrap(cause))
	if !Is(err) || !errors.Is(err, cause) || err.Error() != "decoding: schema version 9 is unknown" {
		t.Fatalf("a marked error: Is %v, errors.Is %v, text %q", Is(err), errors.Is(err, cause), err)
	}
	if Is(cause) || Is(nil) || Wrap(nil) != nil {
		t.Fatalf("unmarked: Is(cause) %v, Is(nil) %v, Wrap(nil) %v", Is(cause), Is(nil), Wrap(nil))
	}
}
