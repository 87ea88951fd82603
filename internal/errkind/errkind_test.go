package errkind

import (
	"errors"
	"fmt"
	"testing"
)

func TestOfAndParse(t *testing.T) {
	for _, k := range all {
		err := fmt.Errorf("op x: %w", fmt.Errorf("inner: %w", k))
		if got := Of(err); got != k {
			t.Errorf("Of(wrapped %v) = %v, want %v", k, got, k)
		}
		if got := Parse(k.String()); got != k {
			t.Errorf("Parse(%q) = %v, want %v", k.String(), got, k)
		}
	}
	if got := Of(errors.New("plain")); got != Internal {
		t.Errorf("Of(plain error) = %v, want internal", got)
	}
	if got := Parse("no_such_kind"); got != Internal {
		t.Errorf("Parse(unknown) = %v, want internal", got)
	}
}
