package strictjson

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// TestRefusalsNameWhere checks the path a refusal carries, through
// objects and arrays, and that reading on after a refusal-free subtree
// leaves no step behind.
func TestRefusalsNameWhere(t *testing.T) {
	for _, c := range []struct{ in, path, reason string }{
		{`{"a":1,"a":2}`, "a", "the key appears twice"},
		{`{"a":[1,{"b":true,"c":[0,01]}]}`, "a[1].c[1]", "invalid number"},
		{`[[],{},"x",{"k":"\ud800"}]`, "[3].k", "unpaired UTF-16 surrogate"},
		{`{"ok":{"x":[1,2]},"bad":tru}`, "bad", "unexpected"},
		{`{"a":1 "b":2}`, "", "expected ',' or '}'"},
	} {
		_, err := Parse([]byte(c.in))
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: want an *Error, got %v", c.in, err)
		}
		if e.Path != c.path || !strings.Contains(e.Reason, c.reason) {
			t.Errorf("%s: got %q at %q, want %q at %q", c.in, e.Reason, e.Path, c.reason, c.path)
		}
	}
}

// manyKeys writes an object of n distinct keys, then the key of index
// repeat again when repeat >= 0.
func manyKeys(n, repeat int) []byte {
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		fmt.Fprintf(&b, `"k%d":%d,`, i, i)
	}
	if repeat >= 0 {
		fmt.Fprintf(&b, `"k%d":0,`, repeat)
	}
	return []byte(strings.TrimSuffix(b.String(), ",") + "}")
}

// TestManyKeys: a repeated key is found wherever it is, among few keys
// (compared one by one) and among many (through a set).
func TestManyKeys(t *testing.T) {
	for _, n := range []int{1, smallObject - 1, smallObject, smallObject + 1, 1000} {
		if _, err := Parse(manyKeys(n, -1)); err != nil {
			t.Fatalf("%d distinct keys: %v", n, err)
		}
		for _, r := range []int{0, n / 2, n - 1} {
			_, err := Parse(manyKeys(n, r))
			var e *Error
			if !errors.As(err, &e) || e.Reason != "the key appears twice" || e.Path != fmt.Sprintf("k%d", r) {
				t.Fatalf("%d keys, k%d again: got %v", n, r, err)
			}
		}
	}
}

// TestTooManyValues: a document of more than MaxValues values is refused
// before its tree costs more than a bounded amount. 4 MiB of "0," (two
// million numbers in one array, the size the HTTP handlers and the inbox
// let through) once built a tree of 1.4 GB.
func TestTooManyValues(t *testing.T) {
	array := func(n int) []byte { return []byte("[" + strings.TrimSuffix(strings.Repeat("0,", n), ",") + "]") }
	if _, err := Parse(array(MaxValues - 1)); err != nil { // the array itself is a value
		t.Fatalf("MaxValues values: %v", err)
	}
	_, err := Parse(array(MaxValues))
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(e.Reason, "more than 65536 values") || e.Path != fmt.Sprintf("[%d]", MaxValues-1) {
		t.Fatalf("MaxValues+1 values: got %v", err)
	}

	huge := array(2 << 20)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = Parse(huge)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("two million values accepted")
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("refusing %d bytes allocated %d MiB", len(huge), grew>>20)
	}
}

func BenchmarkManyKeys(b *testing.B) {
	for _, n := range []int{16, 1000, 10000} {
		doc := manyKeys(n, -1)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(len(doc)))
			for b.Loop() {
				if _, err := Parse(doc); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
