// Package strictjson reads JSON exactly as written, and nothing else: the
// one decoder of the reference system's events and API bodies.
//
// encoding/json is lenient where two readers of one record must not
// disagree: it keeps the last of two equal keys, matches keys in any case,
// replaces invalid UTF-8 and lone UTF-16 surrogates with U+FFFD, reads null
// into any field as "leave it", and (through a Decoder) ignores what follows
// the first value. A producer, a consumer and an auditor reading the same
// bytes with different libraries can then see different orders. Decode
// refuses every such input, with the reason and where (a JSON path such as
// lines[2].sku):
//
//   - the input is valid UTF-8, one JSON value, and nothing but whitespace
//     after it; strings hold no unpaired surrogate escape;
//   - an object has each key at most once (compared after unescaping);
//   - into a struct: every key is a field's json name, exactly (case
//     matters), and every field is there unless its tag says omitempty
//     (optional);
//   - null only into a pointer: nowhere else does it mean anything;
//   - an integer field takes an integer (no fraction, no exponent) in the
//     Go type's range; a string field a string; and so on, no conversions;
//   - a time.Time takes an RFC 3339 time and nothing looser; another type
//     with its own UnmarshalJSON gets its raw value, once the checks above
//     passed.
//
// The parser is this file's: Decode first builds a tree (Parse), which
// events.Decode also uses to read an event's type before its fields. Depth
// is bounded (MaxDepth); the size is the caller's to bound (the HTTP
// handlers read at most a few KiB, the inbox at most its payload limit).
package strictjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxDepth is the deepest nesting of arrays and objects Parse reads.
const MaxDepth = 32

// MaxValues is the most values (each key's value, each array item, each
// scalar) one document may hold. A Value costs about a hundred bytes
// however short its text: 4 MiB of "0," would otherwise build a tree of
// two million of them. No event or API body of the reference system comes
// near this; a document that does is refused before it costs more.
const MaxValues = 65536

// Error is a refusal, with the JSON path of what was refused ("" for the
// whole value) and the reason.
type Error struct {
	Path   string
	Reason string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Reason
	}
	return e.Path + ": " + e.Reason
}

func fail(path, format string, args ...any) error {
	return &Error{Path: path, Reason: fmt.Sprintf(format, args...)}
}

// Kind is the JSON type of a Value.
type Kind int

// The kinds of Value.
const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

var kindNames = [...]string{"null", "a boolean", "a number", "a string", "an array", "an object"}

func (k Kind) String() string { return kindNames[k] }

// Value is one parsed JSON value.
type Value struct {
	Kind   Kind
	Raw    []byte  // the value's bytes as written
	Str    string  // String: the unescaped text; Number: the literal
	Bool   bool    // Bool
	Items  []Value // Array
	Keys   []string
	Fields []Value // Object: Fields[i] is under Keys[i], in the order written
}

// Field returns the value under key in an object.
func (v *Value) Field(key string) (*Value, bool) {
	for i, k := range v.Keys {
		if k == key {
			return &v.Fields[i], true
		}
	}
	return nil, false
}

// Parse reads data as exactly one JSON value under the rules of the package
// doc that do not depend on a target type.
func Parse(data []byte) (*Value, error) {
	if !utf8.Valid(data) {
		return nil, fail("", "not valid UTF-8")
	}
	p := parser{data: data}
	p.space()
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.i < len(p.data) {
		return nil, fail("", "data after the JSON value at byte %d", p.i)
	}
	return &v, nil
}

type parser struct {
	data   []byte
	i      int
	values int
	// where is the path to the value being read, one step per level: a
	// refusal names it, and only a refusal spells it out (building the
	// path of every value read would cost more than reading it).
	where []step
}

type step struct {
	key   string // in an object
	index int    // in an array, when key is ""
	inKey bool
}

func (p *parser) fail(format string, args ...any) error {
	var b strings.Builder
	for _, s := range p.where {
		switch {
		case s.inKey && b.Len() == 0:
			b.WriteString(clip(s.key))
		case s.inKey:
			b.WriteString("." + clip(s.key))
		default:
			fmt.Fprintf(&b, "[%d]", s.index)
		}
	}
	return fail(b.String(), format, args...)
}

func (p *parser) space() {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (Value, error) {
	if depth > MaxDepth {
		return Value{}, p.fail("nested deeper than %d", MaxDepth)
	}
	if p.values++; p.values > MaxValues {
		return Value{}, p.fail("more than %d values in one document", MaxValues)
	}
	if p.i >= len(p.data) {
		return Value{}, p.fail("unexpected end of input")
	}
	start := p.i
	var v Value
	var err error
	switch c := p.data[p.i]; {
	case c == '{':
		v, err = p.object(depth)
	case c == '[':
		v, err = p.array(depth)
	case c == '"':
		v.Kind = String
		v.Str, err = p.string()
	case c == '-' || c >= '0' && c <= '9':
		v.Kind = Number
		v.Str, err = p.number()
	case p.literal("true"):
		v.Kind, v.Bool = Bool, true
	case p.literal("false"):
		v.Kind = Bool
	case p.literal("null"):
		v.Kind = Null
	default:
		return Value{}, p.fail("unexpected %q at byte %d", clip(string(p.data[p.i:min(p.i+8, len(p.data))])), p.i)
	}
	if err != nil {
		return Value{}, err
	}
	v.Raw = p.data[start:p.i]
	return v, nil
}

func (p *parser) literal(word string) bool {
	if strings.HasPrefix(string(p.data[p.i:min(p.i+len(word), len(p.data))]), word) {
		p.i += len(word)
		return true
	}
	return false
}

func (p *parser) object(depth int) (Value, error) {
	v := Value{Kind: Object}
	p.i++ // {
	p.space()
	if p.i < len(p.data) && p.data[p.i] == '}' {
		p.i++
		return v, nil
	}
	// Keys are compared one by one while there are few (most objects have
	// a handful) and through a set past that, so that an object of many
	// keys costs linear time, not quadratic.
	var seen map[string]struct{}
	for {
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != '"' {
			return v, p.fail("expected a key in quotes at byte %d", p.i)
		}
		key, err := p.string()
		if err != nil {
			return v, err
		}
		p.where = append(p.where, step{key: key, inKey: true})
		if p.repeated(&seen, v.Keys, key) {
			return v, p.fail("the key appears twice")
		}
		p.space()
		if p.i >= len(p.data) || p.data[p.i] != ':' {
			return v, p.fail("expected ':' at byte %d", p.i)
		}
		p.i++
		p.space()
		field, err := p.value(depth + 1)
		if err != nil {
			return v, err
		}
		p.where = p.where[:len(p.where)-1]
		v.Keys, v.Fields = append(v.Keys, key), append(v.Fields, field)
		p.space()
		if p.i >= len(p.data) {
			return v, p.fail("unexpected end of input in an object")
		}
		switch p.data[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return v, nil
		default:
			return v, p.fail("expected ',' or '}' at byte %d", p.i)
		}
	}
}

// smallObject is how many keys an object holds before repeated looks them
// up in a set rather than one by one.
const smallObject = 16

// repeated reports whether key is already among keys.
func (p *parser) repeated(seen *map[string]struct{}, keys []string, key string) bool {
	if len(keys) < smallObject {
		for _, k := range keys {
			if k == key {
				return true
			}
		}
		return false
	}
	if *seen == nil {
		*seen = make(map[string]struct{}, 2*len(keys))
		for _, k := range keys {
			(*seen)[k] = struct{}{}
		}
	}
	if _, ok := (*seen)[key]; ok {
		return true
	}
	(*seen)[key] = struct{}{}
	return false
}

func (p *parser) array(depth int) (Value, error) {
	v := Value{Kind: Array}
	p.i++ // [
	p.space()
	if p.i < len(p.data) && p.data[p.i] == ']' {
		p.i++
		return v, nil
	}
	for {
		p.space()
		p.where = append(p.where, step{index: len(v.Items)})
		item, err := p.value(depth + 1)
		if err != nil {
			return v, err
		}
		p.where = p.where[:len(p.where)-1]
		v.Items = append(v.Items, item)
		p.space()
		if p.i >= len(p.data) {
			return v, p.fail("unexpected end of input in an array")
		}
		switch p.data[p.i] {
		case ',':
			p.i++
		case ']':
			p.i++
			return v, nil
		default:
			return v, p.fail("expected ',' or ']' at byte %d", p.i)
		}
	}
}

// string reads a string literal and returns its text.
func (p *parser) string() (string, error) {
	p.i++ // "
	var b strings.Builder
	for {
		if p.i >= len(p.data) {
			return "", p.fail("unterminated string")
		}
		c := p.data[p.i]
		switch {
		case c == '"':
			p.i++
			return b.String(), nil
		case c < 0x20:
			return "", p.fail("control character %#02x in a string at byte %d (escape it)", c, p.i)
		case c != '\\':
			b.WriteByte(c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.data) {
			return "", p.fail("unterminated escape")
		}
		p.i += 2
		switch e := p.data[p.i-1]; e {
		case '"', '\\', '/':
			b.WriteByte(e)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r, err := p.hex4()
			if err != nil {
				return "", err
			}
			if utf16.IsSurrogate(r) {
				// A high surrogate must come first and a low one follow.
				if r >= 0xDC00 || p.i+1 >= len(p.data) || p.data[p.i] != '\\' || p.data[p.i+1] != 'u' {
					return "", p.fail("unpaired UTF-16 surrogate \\u%04x", r)
				}
				p.i += 2
				lo, err := p.hex4()
				if err != nil {
					return "", err
				}
				if r = utf16.DecodeRune(r, lo); r == utf8.RuneError {
					return "", p.fail("unpaired UTF-16 surrogate before \\u%04x", lo)
				}
			}
			b.WriteRune(r)
		default:
			return "", p.fail("invalid escape \\%c", e)
		}
	}
}

func (p *parser) hex4() (rune, error) {
	if p.i+4 > len(p.data) {
		return 0, p.fail("short \\u escape")
	}
	n, err := strconv.ParseUint(string(p.data[p.i:p.i+4]), 16, 16)
	if err != nil {
		return 0, p.fail("invalid \\u escape %q", p.data[p.i:p.i+4])
	}
	p.i += 4
	return rune(n), nil
}

// number reads a number literal as JSON's grammar has it.
func (p *parser) number() (string, error) {
	start := p.i
	digits := func() int {
		n := 0
		for p.i < len(p.data) && p.data[p.i] >= '0' && p.data[p.i] <= '9' {
			p.i++
			n++
		}
		return n
	}
	if p.data[p.i] == '-' {
		p.i++
	}
	first := p.i
	if n := digits(); n == 0 || n > 1 && p.data[first] == '0' {
		return "", p.fail("invalid number %q", clip(string(p.data[start:p.i])))
	}
	if p.i < len(p.data) && p.data[p.i] == '.' {
		p.i++
		if digits() == 0 {
			return "", p.fail("invalid number %q", clip(string(p.data[start:p.i])))
		}
	}
	if p.i < len(p.data) && (p.data[p.i] == 'e' || p.data[p.i] == 'E') {
		p.i++
		if p.i < len(p.data) && (p.data[p.i] == '+' || p.data[p.i] == '-') {
			p.i++
		}
		if digits() == 0 {
			return "", p.fail("invalid number %q", clip(string(p.data[start:p.i])))
		}
	}
	return string(p.data[start:p.i]), nil
}

// Decode parses data and stores it in the value v points to, under every
// rule of the package doc. Every refusal is an *Error.
func Decode(data []byte, v any) error {
	tree, err := Parse(data)
	if err != nil {
		return err
	}
	return tree.Decode(v)
}

// Decode stores the parsed value in the value v points to.
func (v *Value) Decode(target any) error {
	rv := reflect.ValueOf(target)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errors.New("strictjson: Decode needs a non-nil pointer")
	}
	return v.into("", rv.Elem())
}

var (
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	timeType        = reflect.TypeFor[time.Time]()
	rfc3339         = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$`)
)

func (v *Value) into(path string, dst reflect.Value) error {
	if dst.Kind() == reflect.Pointer {
		if v.Kind == Null {
			dst.SetZero()
			return nil
		}
		if dst.IsNil() {
			dst.Set(reflect.New(dst.Type().Elem()))
		}
		return v.into(path, dst.Elem())
	}
	if v.Kind == Null {
		return fail(path, "null is not %s", describe(dst.Type()))
	}
	if dst.Type() == timeType {
		return v.intoTime(path, dst)
	}
	if reflect.PointerTo(dst.Type()).Implements(unmarshalerType) {
		if err := dst.Addr().Interface().(json.Unmarshaler).UnmarshalJSON(v.Raw); err != nil {
			return fail(path, "%v", err)
		}
		return nil
	}
	return v.intoKind(path, dst)
}

// intoTime decodes an RFC 3339 time. time.Time's own UnmarshalJSON takes
// more than RFC 3339 (an hour of one digit, found by the fuzzer against the
// second reader).
func (v *Value) intoTime(path string, dst reflect.Value) error {
	if v.Kind != String || !rfc3339.MatchString(v.Str) {
		return fail(path, "want an RFC 3339 time (2006-01-02T15:04:05Z), got %s", clip(string(v.Raw)))
	}
	t, err := time.Parse(time.RFC3339Nano, v.Str)
	if err != nil {
		return fail(path, "%v", err)
	}
	dst.Set(reflect.ValueOf(t))
	return nil
}

// intoKind decodes v into dst by dst's kind: a value of another JSON kind,
// or out of dst's range, is refused.
func (v *Value) intoKind(path string, dst reflect.Value) error {
	want := func(k Kind) error {
		if v.Kind != k {
			return fail(path, "want %s, got %s", describe(dst.Type()), v.Kind)
		}
		return nil
	}
	switch dst.Kind() {
	case reflect.String:
		if err := want(String); err != nil {
			return err
		}
		dst.SetString(v.Str)
	case reflect.Bool:
		if err := want(Bool); err != nil {
			return err
		}
		dst.SetBool(v.Bool)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if err := want(Number); err != nil {
			return err
		}
		n, err := strconv.ParseInt(v.Str, 10, dst.Type().Bits())
		if err != nil {
			return fail(path, "want an integer in the range of %s, got %s", dst.Type(), clip(v.Str))
		}
		dst.SetInt(n)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if err := want(Number); err != nil {
			return err
		}
		n, err := strconv.ParseUint(v.Str, 10, dst.Type().Bits())
		if err != nil {
			return fail(path, "want an integer in the range of %s, got %s", dst.Type(), clip(v.Str))
		}
		dst.SetUint(n)
	case reflect.Float32, reflect.Float64:
		if err := want(Number); err != nil {
			return err
		}
		f, err := strconv.ParseFloat(v.Str, dst.Type().Bits())
		if err != nil {
			return fail(path, "want a number in the range of %s, got %s", dst.Type(), clip(v.Str))
		}
		dst.SetFloat(f)
	case reflect.Slice:
		if err := want(Array); err != nil {
			return err
		}
		s := reflect.MakeSlice(dst.Type(), len(v.Items), len(v.Items))
		for i := range v.Items {
			if err := v.Items[i].into(fmt.Sprintf("%s[%d]", path, i), s.Index(i)); err != nil {
				return err
			}
		}
		dst.Set(s)
	case reflect.Struct:
		if err := want(Object); err != nil {
			return err
		}
		return v.intoStruct(path, dst)
	default:
		return fmt.Errorf("strictjson: %s: cannot decode into %s", path, dst.Type())
	}
	return nil
}

// field is one JSON name of a struct, with where it goes.
type field struct {
	name     string
	index    []int
	optional bool
}

// fields lists t's JSON names, those of embedded structs among them.
func fields(t reflect.Type) []field {
	var out []field
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for _, sub := range fields(f.Type) {
				sub.index = append([]int{i}, sub.index...)
				out = append(out, sub)
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, field{name: name, index: []int{i}, optional: strings.Contains(","+opts+",", ",omitempty,")})
	}
	return out
}

func (v *Value) intoStruct(path string, dst reflect.Value) error {
	fs := fields(dst.Type())
	for i, key := range v.Keys {
		var f *field
		for j := range fs {
			if fs[j].name == key {
				f = &fs[j]
				break
			}
		}
		if f == nil {
			return fail(join(path, key), "unknown field%s", didYouMean(key, fs))
		}
		if err := v.Fields[i].into(join(path, key), dst.FieldByIndex(f.index)); err != nil {
			return err
		}
	}
	for _, f := range fs {
		if _, ok := v.Field(f.name); !ok && !f.optional {
			return fail(join(path, f.name), "missing")
		}
	}
	return nil
}

func didYouMean(key string, fs []field) string {
	for _, f := range fs {
		if strings.EqualFold(f.name, key) {
			return fmt.Sprintf(" (names are case-sensitive: %q)", f.name)
		}
	}
	return ""
}

func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice:
		return "an array"
	case reflect.Struct:
		return "an object"
	}
	return t.String()
}

func join(path, key string) string {
	if path == "" {
		return clip(key)
	}
	return path + "." + clip(key)
}

// clip keeps a refusal short and printable, whatever the input held.
func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
