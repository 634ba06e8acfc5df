package singleton

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strconv"
	"strings"

	"github.com/hibiken/asynq"

	"github.com/jobguard/jobguard/internal/asynqkey"
)

// The built-in key options' keys start with asynqkey.TypeKey, so that they
// do not collide with keys of other adapters sharing the Locker. KeyFunc
// keys are used as returned.

// KeyByType keys a task by its type: one task of a type runs at a time (or
// WithLimit of them). The key is "asynq:<type>". This is the default.
func KeyByType() Option {
	return keyOpt(func(c *config) { c.keys = append(c.keys, keySpec{name: "KeyByType()", fn: keyByType}) })
}

func keyByType(_ context.Context, t *asynq.Task) (string, error) {
	return asynqkey.TypeKey(t.Type()), nil
}

// KeyByTaskID keys a task by its asynq task ID (the key is
// "asynq:<type>:id:<id>"). It stops asynq's own re-deliveries of one task from
// overlapping the run still in progress: after a worker lease expiry, from the
// recoverer, or after a shutdown put the task back while its handler still
// runs. A copy enqueued by Requeue keeps its first task's key: it carries
// that task's ID (its label) in the task header "jobguard-origin-id".
// Whatever the policy, a re-delivery waits for the run in progress (see
// Middleware). The handler must be called by an asynq server; otherwise the
// task fails with ErrKey.
func KeyByTaskID() Option {
	return keyOpt(func(c *config) { c.keys = append(c.keys, keySpec{name: "KeyByTaskID()", fn: keyByTaskID}) })
}

func keyByTaskID(ctx context.Context, t *asynq.Task) (string, error) {
	id := t.Headers()[asynqkey.LabelHeader]
	if id == "" {
		if id, _ = taskIdentity(ctx); id == "" {
			return "", errors.New("no task ID in the context (the handler was not called by an asynq server)")
		}
	}
	return asynqkey.TypeKey(t.Type()) + ":id:" + id, nil
}

// KeyByPayload keys a task by its type and payload: identical tasks do not run
// at once, different payloads do. The key is "asynq:<type>:payload:<hash>",
// the hash being the first 128 bits of the payload's SHA-256 in hex.
func KeyByPayload() Option {
	return keyOpt(func(c *config) { c.keys = append(c.keys, keySpec{name: "KeyByPayload()", fn: keyByPayload}) })
}

func keyByPayload(_ context.Context, t *asynq.Task) (string, error) {
	sum := sha256.Sum256(t.Payload())
	return asynqkey.TypeKey(t.Type()) + ":payload:" + hex.EncodeToString(sum[:16]), nil
}

// KeyByFields keys a task by its type and the values of fields of its JSON
// object payload, such as "tenant_id" for per-tenant serialization. A name
// with dots is a path into nested objects: "tenant.id" is the member "id"
// of the object in the member "tenant" ({"tenant":{"id":"acme"}}); a path
// never reads into arrays. Put a backslash before a dot that is part of a
// member's name, and before a backslash: KeyByFields(`tenant\.id`) reads
// the top-level member "tenant.id". A dotted path that leads to no value
// in a payload that has a top-level member named as the field is written
// ("tenant.id") reads that member, and a payload that has both fails with
// ErrKey.
// The key is "asynq:<type>:<field>=<value>[,<field>=<value>...]", each field
// as written and each value in canonical JSON, so that producers with
// different JSON encoders agree: strings unescaped where JSON allows
// ("caf\u00e9" and "café" are one key), numbers by value (1, 1.0 and 1e0
// are one key), object members sorted, no spaces. A string keeps its
// quotes, so 42 and "42" differ.
// A payload that is not a JSON object, or lacks a field, or has it null or
// "", fails the task with ErrKey. At least one field is required; names must
// be non-empty and distinct, and a path's members non-empty (not "a..b",
// ".a" or "a."), with a backslash only before a dot or a backslash:
// ErrInvalid otherwise, naming the field.
func KeyByFields(fields ...string) Option {
	spec := keySpec{name: fmt.Sprintf("KeyByFields(%s)", quoteAll(fields))}
	seen := make(map[string]bool, len(fields))
	paths := make([]fieldPath, len(fields))
	switch {
	case len(fields) == 0:
		spec.err = errors.New("no field given")
	default:
		for i, f := range fields {
			switch {
			case f == "":
				spec.err = errors.New("field name is empty")
			case seen[f]:
				spec.err = fmt.Errorf("field %q is given twice", f)
			default:
				paths[i], spec.err = parseFieldPath(f)
			}
			if spec.err != nil {
				break
			}
			seen[f] = true
		}
	}
	spec.fn = func(_ context.Context, t *asynq.Task) (string, error) { return keyByFields(t, paths) }
	return keyOpt(func(c *config) { c.keys = append(c.keys, spec) })
}

// fieldPath is a KeyByFields field: its name as written and the members of
// its path, unescaped.
type fieldPath struct {
	name    string
	members []string
}

// parseFieldPath splits f at its unescaped dots into the members of its
// path.
func parseFieldPath(f string) (fieldPath, error) {
	p := fieldPath{name: f}
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		switch c := f[i]; {
		case c == '\\':
			if i+1 == len(f) || (f[i+1] != '.' && f[i+1] != '\\') {
				return p, fmt.Errorf("field %q: a backslash must be followed by '.' or another backslash", f)
			}
			i++
			b.WriteByte(f[i])
		case c == '.':
			p.members = append(p.members, b.String())
			b.Reset()
		default:
			b.WriteByte(c)
		}
	}
	p.members = append(p.members, b.String())
	for i, m := range p.members {
		if m == "" {
			return p, fmt.Errorf(`field %q: member %d of the path is empty (write \. for a dot in a member's name)`, f, i+1)
		}
	}
	return p, nil
}

// describe names the path's members for errors: `member "id" of member
// "tenant"`.
func (p fieldPath) describe() string {
	parts := make([]string, len(p.members))
	for i, m := range p.members {
		parts[len(p.members)-1-i] = fmt.Sprintf("member %q", m)
	}
	return strings.Join(parts, " of ")
}

// lookup returns the value of p in obj: at its path or, when the path
// leads to no value, in the top-level member named as p is written (a
// path's name only).
func (p fieldPath) lookup(obj map[string]json.RawMessage) (json.RawMessage, error) {
	raw, found := obj[p.members[0]]
	for _, m := range p.members[1:] {
		var inner map[string]json.RawMessage
		if !found || json.Unmarshal(raw, &inner) != nil || inner == nil {
			found = false
			break
		}
		raw, found = inner[m]
	}
	literal, hasLiteral := obj[p.name]
	hasLiteral = hasLiteral && (len(p.members) > 1 || p.members[0] != p.name)
	switch {
	case found && hasLiteral:
		return nil, fmt.Errorf("field %q is ambiguous: the payload has both the path (%s) and a top-level member named %q (write %q for the top-level member)",
			p.name, p.describe(), p.name, strings.ReplaceAll(strings.ReplaceAll(p.name, `\`, `\\`), ".", `\.`))
	case found:
		return raw, nil
	case hasLiteral:
		return literal, nil
	case len(p.members) > 1:
		return nil, fmt.Errorf("payload has no field %q (%s), nor a top-level member named %q", p.name, p.describe(), p.name)
	}
	return nil, fmt.Errorf("payload has no field %q", p.name)
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

func keyByFields(t *asynq.Task, fields []fieldPath) (string, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(t.Payload(), &obj); err != nil {
		return "", fmt.Errorf("payload is not a JSON object: %w", err)
	}
	if obj == nil {
		return "", errors.New("payload is not a JSON object: null")
	}
	var b strings.Builder
	b.WriteString(asynqkey.TypeKey(t.Type()) + ":")
	for i, p := range fields {
		f := p.name
		raw, err := p.lookup(obj)
		if err != nil {
			return "", err
		}
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			return "", fmt.Errorf("field %q: %w", f, err)
		}
		switch v {
		case nil:
			return "", fmt.Errorf("field %q is null", f)
		case "":
			return "", fmt.Errorf("field %q is empty", f)
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(f + "=")
		canonicalJSON(&b, v)
	}
	return b.String(), nil
}

// canonicalJSON writes v, as decoded with UseNumber, in one canonical form.
func canonicalJSON(b *strings.Builder, v any) {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case json.Number:
		b.WriteString(canonicalNumber(string(x)))
	case string:
		var buf bytes.Buffer
		e := json.NewEncoder(&buf)
		e.SetEscapeHTML(false)
		_ = e.Encode(x) // a string always encodes
		b.Write(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			canonicalJSON(b, e)
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			canonicalJSON(b, k)
			b.WriteByte(':')
			canonicalJSON(b, x[k])
		}
		b.WriteByte('}')
	}
}

// canonicalNumber writes a JSON number by value: an integer in decimal
// digits, anything else in the shortest form that reads back as the same
// float64.
func canonicalNumber(n string) string {
	r, ok := new(big.Rat).SetString(n)
	if !ok {
		return n
	}
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// KeyFunc keys a task by fn's result, used as the key as returned (no
// prefix). An error from fn, or an empty key, fails the task with ErrKey,
// wrapping fn's error. fn must not be nil.
func KeyFunc(fn func(ctx context.Context, t *asynq.Task) (string, error)) Option {
	spec := keySpec{name: "KeyFunc(nil)", fn: fn}
	if fn == nil {
		spec.err = errors.New("func is nil")
	} else {
		spec.name = "KeyFunc(fn)"
	}
	return keyOpt(func(c *config) { c.keys = append(c.keys, spec) })
}

// keyOf derives t's key, scoped to its queue with PerQueue.
func (m *guarded) keyOf(ctx context.Context, t *asynq.Task) (string, error) {
	return deriveKey(ctx, t, m.key, m.perQueue)
}

// deriveKey derives t's key with key, scoped to its queue when perQueue.
func deriveKey(ctx context.Context, t *asynq.Task, key keyFunc, perQueue bool) (string, error) {
	k, err := key(ctx, t)
	if err != nil {
		return "", err
	}
	if k == "" {
		return "", errors.New("the key is empty")
	}
	if perQueue {
		_, q := taskIdentity(ctx)
		if q == "" {
			return "", errors.New("no queue name in the context (the handler was not called by an asynq server)")
		}
		k += "@" + q
	}
	return k, nil
}
