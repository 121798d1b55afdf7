// Package signature lets a consumer apply only what a producer it trusts
// wrote. Anyone who can write to a topic can write a record that looks like
// a producer's event; the inbox deduplicates by message id, so a forged
// event under a fresh id is new to it. A signature closes that:
//
//   - the producer's relay signs every message it publishes ([Publisher]):
//     an HMAC-SHA256, under one of the producer's keys, over the message id,
//     the topic, the partition key, the payload and its sequence number
//     ([SequenceHeader], where it has one), carried in two headers
//     ([KeyIDHeader], [Header]);
//   - the consumer's inbox verifies it before it looks the id up
//     ([Verifier.Verify], wired in with inbox.Config.Verify): a record
//     without a signature, under a key the consumer does not hold, under a
//     key not allowed to sign for its topic, or whose signature does not
//     match, is quarantined with the reason, never applied.
//
// # Keys and rotation
//
// A [Key] is an id and a secret of at least [MinSecretBytes] bytes. The
// producer signs with one key; a consumer holds the keys of the producers it
// trusts, each with the topics it may sign for. To rotate without downtime:
// give the consumers the new key beside the old one (both verify), then
// switch the producer to the new key, then, once no message signed with the
// old key can still be delivered (Kafka's retention, and the inbox's
// redelivery horizon), remove the old key from the consumers.
//
// # What it does not do
//
// HMAC keys are shared secrets: a consumer that holds a producer's key could
// sign as that producer. Give each producer its own key, and its consumers
// only the keys they need; where consumers must not be able to sign, an
// asymmetric scheme (Ed25519) fits better, at about 50 times the CPU per
// message. A signature proves who wrote a message, not that it is new: a
// copy of a signed message replayed by someone else is a duplicate, which the
// inbox suppresses as it suppresses any redelivery. Headers other than the
// sequence number are not signed, and the consumer must not trust them.
package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// The headers a signed message carries.
const (
	KeyIDHeader = "signature_key_id" // the id of the key that signed it
	Header      = "signature"        // base64url (no padding) of the HMAC-SHA256
)

// SequenceHeader is the header of a message's place in its partition key's
// history (outbox.SequenceMetadata). A message that carries it is signed
// over it too, in a header of its own (SequenceSignatureHeader), so that a
// number altered or stripped fails verification like an altered payload,
// while the signature in Header stays what it always was: consumers that
// do not know numbers verify what an upgraded producer signs.
const SequenceHeader = "outbox_key_seq"

// SequenceSignatureHeader holds the HMAC over the signed fields and the
// sequence number, under the same key (base64url, no padding).
const SequenceSignatureHeader = "signature_seq"

// MinSecretBytes is the shortest secret a Key may have: HMAC-SHA256's block
// of security, 256 bits.
const MinSecretBytes = 32

// Key is one signing key.
type Key struct {
	// ID names the key in the KeyIDHeader of what it signs: printable ASCII,
	// 1 to 64 bytes, no spaces.
	ID string
	// Secret is at least MinSecretBytes random bytes.
	Secret []byte
}

// Validate reports what is wrong with k, naming the field.
func (k Key) Validate() error {
	if k.ID == "" || len(k.ID) > 64 || strings.IndexFunc(k.ID, func(r rune) bool { return r <= ' ' || r > '~' }) >= 0 {
		return fmt.Errorf("signature: Key.ID %q must be 1 to 64 printable ASCII characters without spaces", k.ID)
	}
	if len(k.Secret) < MinSecretBytes {
		return fmt.Errorf("signature: key %s: Key.Secret has %d bytes, at least %d needed", k.ID, len(k.Secret), MinSecretBytes)
	}
	return nil
}

// ParseKey reads a key written as FormatKey writes it: its id, a colon,
// and its secret in base64url (padding optional), as in an environment
// variable.
func ParseKey(s string) (Key, error) {
	id, secret, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return Key{}, errors.New("signature: a key is written id:secret, the secret in base64url; got no colon")
	}
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(secret, "="))
	if err != nil {
		return Key{}, fmt.Errorf("signature: key %s: the secret is not base64url: %w", clip(id), err)
	}
	k := Key{ID: id, Secret: raw}
	return k, k.Validate()
}

// FormatKey writes k as ParseKey reads it. The result holds the secret.
func FormatKey(k Key) string {
	return k.ID + ":" + base64.RawURLEncoding.EncodeToString(k.Secret)
}

// ErrInvalid wraps every reason Verify refuses a message for.
var ErrInvalid = errors.New("signature invalid")

// Sign sets msg's signature headers: key k's HMAC over msg's id, topic,
// partition key, payload and, where it carries one, SequenceHeader. It
// replaces a signature msg already carries.
func Sign(k Key, topic, key string, msg *message.Message) {
	msg.Metadata.Set(KeyIDHeader, k.ID)
	msg.Metadata.Set(Header, base64.RawURLEncoding.EncodeToString(mac(k.Secret, k.ID, topic, key, msg, nil)))
	if seq, ok := msg.Metadata[SequenceHeader]; ok {
		msg.Metadata.Set(SequenceSignatureHeader, base64.RawURLEncoding.EncodeToString(mac(k.Secret, k.ID, topic, key, msg, &seq)))
	} else {
		delete(msg.Metadata, SequenceSignatureHeader)
	}
}

// mac is the HMAC-SHA256 of the signed fields, each length-prefixed so that
// no two different messages sign the same bytes: under the v1 tag without a
// sequence number (Header), under the v2 tag with seq last
// (SequenceSignatureHeader).
func mac(secret []byte, keyID, topic, key string, msg *message.Message, seq *string) []byte {
	h := hmac.New(sha256.New, secret)
	var n [binary.MaxVarintLen64]byte
	fields := [][]byte{[]byte("outbox-inbox signature v1"), []byte(keyID), []byte(msg.UUID), []byte(topic), []byte(key), msg.Payload}
	if seq != nil {
		fields[0] = []byte("outbox-inbox signature v2")
		fields = append(fields, []byte(*seq))
	}
	for _, field := range fields {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(field)))])
		h.Write(field)
	}
	return h.Sum(nil)
}

// Trusted is a key a consumer accepts, and the topics it may sign for.
type Trusted struct {
	Key
	// Topics the key may sign for. Required: a key trusted for every topic
	// would let one producer speak for all of them.
	Topics []string
}

// Verifier checks signatures against the keys a consumer trusts.
type Verifier struct {
	keys map[string]Trusted
}

// NewVerifier returns a Verifier that accepts each of keys for its topics.
// Two keys may be valid at once (a rotation's overlap); their ids must
// differ.
func NewVerifier(keys ...Trusted) (*Verifier, error) {
	if len(keys) == 0 {
		return nil, errors.New("signature: a Verifier needs at least one key")
	}
	v := &Verifier{keys: map[string]Trusted{}}
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, err
		}
		if len(k.Topics) == 0 {
			return nil, fmt.Errorf("signature: key %s: Trusted.Topics is empty; name the topics it may sign for", k.ID)
		}
		if _, dup := v.keys[k.ID]; dup {
			return nil, fmt.Errorf("signature: key %s given twice", k.ID)
		}
		v.keys[k.ID] = k
	}
	return v, nil
}

// Verify checks that msg, read from topic under the partition key key,
// carries a signature of a trusted key allowed for topic over exactly its
// id, topic, key and payload, and, where it carries a SequenceSignatureHeader,
// over its sequence number too. A sequence number without that signature is
// removed from msg's metadata: nothing downstream may read a number nobody
// signed. Every refusal wraps ErrInvalid and says why.
func (v *Verifier) Verify(topic, key string, msg *message.Message) error {
	id, sig := msg.Metadata.Get(KeyIDHeader), msg.Metadata.Get(Header)
	switch {
	case id == "" && sig == "":
		return fmt.Errorf("%w: the message is not signed (no %s header)", ErrInvalid, Header)
	case id == "":
		return fmt.Errorf("%w: a signature without a %s header", ErrInvalid, KeyIDHeader)
	}
	k, ok := v.keys[id]
	if !ok {
		return fmt.Errorf("%w: signed with key %q, which this consumer does not trust", ErrInvalid, clip(id))
	}
	if !slices.Contains(k.Topics, topic) {
		return fmt.Errorf("%w: key %s may not sign for topic %q", ErrInvalid, k.ID, clip(topic))
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || len(got) != sha256.Size {
		return fmt.Errorf("%w: the %s header is not a base64url HMAC-SHA256", ErrInvalid, Header)
	}
	if !hmac.Equal(got, mac(k.Secret, k.ID, topic, key, msg, nil)) {
		return fmt.Errorf("%w: the signature of key %s does not match the message's id, topic, key and payload", ErrInvalid, k.ID)
	}
	seq, numbered := msg.Metadata[SequenceHeader]
	switch sig, ok := msg.Metadata[SequenceSignatureHeader]; {
	case ok:
		got, err := base64.RawURLEncoding.DecodeString(sig)
		if err != nil || !hmac.Equal(got, mac(k.Secret, k.ID, topic, key, msg, &seq)) {
			return fmt.Errorf("%w: the %s signature of key %s does not match the message's sequence number", ErrInvalid, SequenceSignatureHeader, k.ID)
		}
	case numbered:
		// A number no signature covers (a relay that signs without
		// numbers, during an upgrade or a rollback): nobody vouches for
		// it, so it goes, and the message verifies unnumbered.
		delete(msg.Metadata, SequenceHeader)
	}
	return nil
}

func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// Publisher signs every message with Key before Next publishes it: put it
// between a relay and its broker publisher (outbox.RelayConfig.Publisher),
// so every row the outbox publishes goes out signed, whoever wrote it (the
// domain's events, the inbox's dead letters, an operator's redrive).
type Publisher struct {
	Next message.Publisher
	Key  Key
	// PartitionKey returns the key the broker publisher sends msg under, as
	// the Next publisher's marshaler computes it: outbox.PartitionKey for
	// the outbox's relay (the KeyMetadata entry). Required.
	PartitionKey func(topic string, msg *message.Message) (string, error)
}

// NewPublisher returns next behind a Publisher that signs with k.
func NewPublisher(next message.Publisher, k Key, partitionKey func(string, *message.Message) (string, error)) (*Publisher, error) {
	if err := k.Validate(); err != nil {
		return nil, err
	}
	if next == nil || partitionKey == nil {
		return nil, errors.New("signature: NewPublisher needs a publisher and a PartitionKey")
	}
	return &Publisher{Next: next, Key: k, PartitionKey: partitionKey}, nil
}

// Publish signs msgs and publishes them to topic.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		key, err := p.PartitionKey(topic, msg)
		if err != nil {
			return fmt.Errorf("signature: reading the partition key of %s: %w", msg.UUID, err)
		}
		Sign(p.Key, topic, key, msg)
	}
	return p.Next.Publish(topic, msgs...)
}

// Close closes Next.
func (p *Publisher) Close() error { return p.Next.Close() }
