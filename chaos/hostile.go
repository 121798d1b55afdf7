package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/outboxref/outbox-inbox/chaos/judge"
	"github.com/outboxref/outbox-inbox/chaos/system"
	"github.com/outboxref/outbox-inbox/pkg/failpoint"
	"github.com/outboxref/outbox-inbox/pkg/outbox"
	"github.com/outboxref/outbox-inbox/pkg/signature"
	"github.com/outboxref/outbox-inbox/services/events"
	"github.com/outboxref/outbox-inbox/services/runtime/kafkaconf"
)

// hostileMsg is one hostile message class, published straight onto a topic
// with a Kafka client, bypassing every outbox.
type hostileMsg struct {
	class    string
	consumer string // the service whose inbox must catch it
	topic    string
	id       string            // message id ("" for the missing-id class)
	storedID string            // the id its quarantine row has, when not id (an id the inbox cannot store as text)
	key      string            // the record's key, when not its producer's (recordKey)
	payload  []byte            // nil: the record has no value at all (a tombstone)
	headers  map[string]string // metadata beyond the partition key
	times    int               // deliveries
	kind     string            // the inbox_quarantine kind it must end as, judge.KindRefused or judge.KindBrokerRefused
	reason   string            // what its reason must say, when set
	// forge says how the record is signed. "": as its topic's producer
	// signs (a producer's own bug, which must reach the inbox's checks and
	// the handler); forgeNone, forgeStranger, forgeTampered: a forgery.
	forge string
	// as is the principal that writes it, when not the harness's own: a
	// login the broker must refuse on this topic (judge.KindBrokerRefused).
	as string
	// seq is its place in its key's history (outbox.SequenceMetadata), set
	// before it is signed; breaks is the continuity breach its consumer
	// must record on it (Kind, Expected, Got), when it breaks the history.
	seq    string
	breaks *judge.BreachInjected
	// order is the order a wrong answer concerns (hostileWrongAnswer): one
	// the harness paid itself, for a SKU inventory does not stock.
	order string
}

// The forgeries: no signature, a key no consumer trusts, and the
// producer's real signature over another payload.
const (
	forgeNone     = "unsigned"
	forgeStranger = "stranger-key"
	forgeTampered = "tampered"
)

type hostile struct {
	sys   *system.System
	inbox bool // the consumers run their inbox
	// keys: effects carry their idempotency key. Without (the effect
	// control run) no wrong answer is sent: its refund, repeated without
	// its key, would be refused by the provider as already made, and the
	// control's effect windows must each show a double capture.
	keys  bool
	rng   *rand.Rand
	msgs  []hostileMsg
	http  httpResults  // hostile_http.go
	kafka kafkaResults // hostile_broker.go
	sent  atomic.Bool
}

func newHostile(sys *system.System, seed uint64, inbox bool) *hostile {
	return &hostile{sys: sys, inbox: inbox, rng: rand.New(rand.NewPCG(seed, 0xbad))}
}

// The hostile classes, all required by the ci profile.
const (
	hostileMalformed    = "malformed_json"
	hostileSchema       = "unknown_schema_version"
	hostileNoID         = "missing_message_id"
	hostileConflict     = "same_id_different_payload"
	hostileOversized    = "oversized_payload"
	hostileWrongTypes   = "wrong_field_types"
	hostileUnknownOrder = "unknown_order"
	hostileBurst        = "burst_50_deliveries"
	hostileOverflow     = "quantity_overflow"
	hostileNUL          = "nul_in_sku"
	hostileNegative     = "negative_quantity"
	hostileZero         = "zero_quantity"
	hostileNotUUID      = "order_id_not_uuid"
	hostileDecided      = "fresh_id_decided_order"
	hostileIDFormat     = "id_not_issued_format"
	hostileOtherTopic   = "same_id_other_topic"
	hostileNearLimit    = "near_broker_limit"
	// An OrderCaptured for an order inventory never reserved: selling what
	// nobody reserved; the guard must refuse it.
	hostileCaptureUnreserved = "capture_of_unreserved_order"

	// Forgeries (#30): written by a client that may write the topic but
	// holds no key its consumer trusts. Sent when the services sign.
	hostileForgedUnsigned = "forged_unsigned"
	hostileForgedStranger = "forged_untrusted_key"
	hostileForgedTampered = "forged_tampered_payload"
	hostileForgedAnswer   = "forged_answer_unsigned"
	// Writers the broker must refuse (#30), with the producer's real
	// signature (a stolen signing key is not a Kafka login): another
	// service's principal, and one with no grants. Sent when the broker
	// authenticates.
	hostileOtherPrincipal = "written_by_other_service"
	hostileNoGrants       = "written_without_rights"

	// Records the inbox cannot store as they arrived, or that a lax JSON
	// reader reads otherwise than a strict one (#31).
	hostileNullValue    = "null_value"
	hostileEmptyValue   = "empty_value"
	hostileBinaryValue  = "binary_value"
	hostileBinaryMeta   = "non_text_headers_and_key"
	hostileBinaryID     = "non_text_message_id"
	hostileDuplicateKey = "duplicate_json_key"
	hostileCaseKey      = "json_key_case_variant"
	hostileTrailing     = "data_after_json_value"
	hostileSurrogate    = "lone_utf16_surrogate"

	// A producer with a bug, signing its bug (#44): records whose envelope
	// says otherwise than their payload. The inbox must refuse each before
	// the handler runs (inbox.Config.Envelope, events.RecordEnvelope).
	hostileEnvKey   = "envelope_key_other_order"     // an OrderPaid keyed under another order
	hostileEnvType  = "envelope_type_header_other"   // an OrderPaid whose type header says OrderCaptured
	hostileEnvTopic = "envelope_type_on_other_topic" // an InventoryReserved on orders.events

	// A producer whose numbering of a key's history breaks (#44), signed as
	// inventory signs: InventoryReserved events for an order orders never
	// saw (each dead-lettered, as an unknown order), numbered as inventory's
	// outbox numbers. The consumer must record the break (judge.Continuity).
	hostileSeqSkipFirst    = "sequence_skipped_first"  // numbered 1
	hostileSeqSkip         = "sequence_skipped"        // the key's next, numbered 3: 2 never came (a gap)
	hostileSeqRewindFirst  = "sequence_rewound_first"  // numbered 1
	hostileSeqRewindSecond = "sequence_rewound_second" // numbered 2
	hostileSeqRewind       = "sequence_rewound"        // numbered 2 again under a fresh id (a rewind)

	// A producer with a bug, signing a wrong but well-formed answer (#44):
	// an InventoryReserved, signed as inventory signs, for an order the
	// harness has just paid for a SKU inventory does not stock, published
	// at once. Orders' guard refuses it if inventory's rejection came
	// first; else orders applies it and captures the payment, and the
	// auditor must find the disagreement and have the capture refunded
	// (judge.KindRefusedOrRepaired).
	hostileWrongAnswer = "wrong_answer_signed"
)

// nearLimitBytes is the near_broker_limit record's size, as Sarama counts
// it: under the harness producer's 1 MiB and the brokers' default
// max.message.bytes (1,048,588), over the relay's 1,000,000, so the dead
// letter it becomes cannot carry it whole.
const nearLimitBytes = 1_040_000

func (h *hostile) build(ctx context.Context) error {
	newID := func() string { return uuid.Must(uuid.NewV7()).String() }
	// A real OrderPaid that inventory has already decided: the conflict
	// sends its id with another payload, and fresh_id_decided_order its
	// payload under a fresh id (the inbox cannot know that one; the domain
	// guard must refuse it). On a slow start (real Kafka, a loaded machine)
	// none may be decided yet when the harness sends: wait, up to two
	// minutes.
	var realID, decided string
	var realPayload []byte
	waitCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		// An order inventory decided and orders settled: a forged answer for
		// it must be refused, not raced against the real one.
		var candidates []string
		rows, err := h.sys.Pools["inventory"].Query(waitCtx, `SELECT order_id FROM decisions ORDER BY decided_at LIMIT 50`)
		if err == nil {
			for rows.Next() {
				var id string
				if err = rows.Scan(&id); err != nil {
					break
				}
				candidates = append(candidates, id)
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err == nil {
			err = h.sys.Pools["orders"].QueryRow(waitCtx, `SELECT id::text FROM orders WHERE id::text = ANY($1) AND status IN ('reserved', 'rejected') LIMIT 1`,
				candidates).Scan(&decided)
		}
		if err == nil {
			err = h.sys.Pools["orders"].QueryRow(waitCtx, `SELECT message_id::text, payload FROM outbox_messages WHERE topic = $1 AND partition_key = $2 AND `+events.OutboxType+` = $3`,
				events.TopicOrders, decided, events.TypeOrderPaid).Scan(&realID, &realPayload)
		}
		if err == nil {
			break
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("finding a settled order: %w", err)
		}
		select {
		case <-waitCtx.Done():
			return fmt.Errorf("finding a settled order: none within 2m: %w", waitCtx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	var wrong []hostileMsg
	if h.sys.Auditor != nil && h.keys {
		lines := []events.Line{{SKU: "unstocked-" + newID()[24:], Quantity: 1}}
		o, err := h.sys.Client.CreateOrder(ctx, lines)
		if err == nil {
			_, err = h.sys.Client.Pay(ctx, o.ID)
		}
		if err != nil {
			return fmt.Errorf("paying the order a wrong answer concerns: %w", err)
		}
		wrong = append(wrong, hostileMsg{class: hostileWrongAnswer, consumer: "orders", topic: events.TopicInventory, id: newID(), order: o.ID,
			payload: fmt.Appendf(nil, `{"schema_version":1,"type":"InventoryReserved","order_id":"%s","lines":[{"sku":"%s","quantity":1}]}`, o.ID, lines[0].SKU),
			times:   1, kind: judge.KindRefusedOrRepaired})
	}
	conflicting := strings.Replace(string(realPayload), `"quantity":`, `"quantity":9`, 1)
	paid := func(lines string) []byte {
		return fmt.Appendf(nil, `{"schema_version":1,"type":"OrderPaid","order_id":"%s","lines":%s,"paid_at":"2026-01-02T03:04:05Z"}`, newID(), lines)
	}
	// Without the inbox (the first control run) the conflicting payload is
	// new to the consumer; the guard must refuse it as a second OrderPaid.
	conflictKind := "payload_conflict"
	if !h.inbox {
		conflictKind = judge.KindRefused
	}

	// The wrong answer first: sent before inventory's own answer, as often
	// as not.
	h.msgs = append(wrong, []hostileMsg{
		{class: hostileMalformed, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: []byte(`{"schema_version":1,"type":"OrderPaid","order_id":`), times: 1, kind: "dead_letter"},
		{class: hostileSchema, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: []byte(`{"schema_version":99,"type":"OrderPaid","order_id":"x","lines":[{"sku":"sku-01","quantity":1}]}`), times: 1, kind: "dead_letter"},
		{class: hostileNoID, consumer: "inventory", topic: events.TopicOrders, id: "",
			payload: []byte(fmt.Sprintf(`{"schema_version":1,"type":"OrderPaid","order_id":"%s","lines":[{"sku":"sku-01","quantity":1}]}`, newID())), times: 1, kind: "invalid"},
		{class: hostileConflict, consumer: "inventory", topic: events.TopicOrders, id: realID,
			payload: []byte(conflicting), times: 1, kind: conflictKind},
		{class: hostileOversized, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: []byte(`{"schema_version":1,"type":"OrderPaid","pad":"` + strings.Repeat("x", 100<<10) + `"}`), times: 1, kind: "invalid"},
		{class: hostileWrongTypes, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: []byte(`{"schema_version":"one","type":"OrderPaid","order_id":7,"lines":"many"}`), times: 1, kind: "dead_letter"},
		{class: hostileUnknownOrder, consumer: "orders", topic: events.TopicInventory, id: newID(),
			payload: []byte(fmt.Sprintf(`{"schema_version":1,"type":"InventoryReserved","order_id":"%s","lines":[{"sku":"sku-01","quantity":1}]}`, newID())), times: 1, kind: "dead_letter"},
		{class: hostileBurst, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: []byte(`{"schema_version":1,"type":"OrderPaid","order_id":"burst","lines":[]}`), times: 50, kind: "dead_letter"},
		// Lines whose sum wraps int64 to a small positive number, and past int32.
		{class: hostileOverflow, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: paid(`[{"sku":"sku-01","quantity":9223372036854775807},{"sku":"sku-01","quantity":9223372036854775807},{"sku":"sku-01","quantity":4}]`), times: 1, kind: "dead_letter"},
		{class: hostileNUL, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: paid(`[{"sku":"sku-01\u0000","quantity":1}]`), times: 1, kind: "dead_letter"},
		{class: hostileNegative, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: paid(`[{"sku":"sku-01","quantity":2},{"sku":"sku-02","quantity":-1}]`), times: 1, kind: "dead_letter"},
		{class: hostileZero, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: paid(`[{"sku":"sku-01","quantity":0}]`), times: 1, kind: "dead_letter"},
		{class: hostileNotUUID, consumer: "orders", topic: events.TopicInventory, id: newID(),
			payload: []byte(`{"schema_version":1,"type":"InventoryRejected","order_id":"' OR 1=1 --","reason":"x"}`), times: 1, kind: "dead_letter"},
		{class: hostileCaptureUnreserved, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: fmt.Appendf(nil, `{"schema_version":1,"type":"OrderCaptured","order_id":"%s","capture_id":"cap_forged"}`, newID()),
			times:   1, kind: judge.KindRefused},
		{class: hostileDecided, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: realPayload, times: 1, kind: judge.KindRefused},
		// The applied OrderPaid's id in another spelling: a new key to an
		// inbox that compared text.
		{class: hostileIDFormat, consumer: "inventory", topic: events.TopicOrders, id: strings.ToUpper(realID),
			payload: realPayload, times: 1, kind: "invalid"},
		// The OrderPaid's id on the other topic, as a forged answer to its
		// settled order: new to orders' inbox, refused by its guard.
		{class: hostileOtherTopic, consumer: "orders", topic: events.TopicInventory, id: realID,
			payload: fmt.Appendf(nil, `{"schema_version":1,"type":"InventoryRejected","order_id":"%s","reason":"forged"}`, decided),
			times:   1, kind: judge.KindRefused},
		nearLimit(newID()),

		// A tombstone: no value at all, which the quarantine must store as
		// "nothing" (a NOT NULL payload once failed its insert on every
		// redelivery and stalled the partition behind it).
		{class: hostileNullValue, consumer: "inventory", topic: events.TopicOrders, id: newID(), payload: nil, times: 1, kind: "dead_letter"},
		{class: hostileEmptyValue, consumer: "inventory", topic: events.TopicOrders, id: newID(), payload: []byte{}, times: 1, kind: "dead_letter"},
		{class: hostileBinaryValue, consumer: "orders", topic: events.TopicInventory, id: newID(),
			payload: []byte("\x00\xff\xfe{\"schema_version\":1}\x00\xc3\x28"), times: 1, kind: "dead_letter"},
		// Headers and a key no text column can hold as they are (NUL,
		// invalid UTF-8), around a payload that is not an event.
		{class: hostileBinaryMeta, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			key:     judge.HostileKeyPrefix + "\xff\x00key",
			payload: []byte(`{"schema_version":1,"type":"OrderPaid"}`),
			headers: map[string]string{"x-nul": "a\x00b", "x-latin1": "caf\xe9", "x-\xff\x00": "name not text"}, times: 1, kind: "dead_letter"},
		// An id header that is not text: quarantined as invalid, with the id
		// it cannot store left out of message_id (and kept in its reason).
		{class: hostileBinaryID, consumer: "orders", topic: events.TopicInventory, id: "\xff\xfe\x00" + newID(), storedID: "",
			payload: fmt.Appendf(nil, `{"schema_version":1,"type":"InventoryRejected","order_id":"%s","reason":"x"}`, decided), times: 1, kind: "invalid"},
		// JSON that encoding/json reads one way and a strict reader refuses:
		// the order id twice (the last wins), a key in another case (matched
		// case-insensitively), a second value after the event, and a lone
		// surrogate (read as U+FFFD). Each names a real, settled order or a
		// plausible line, so a lax reader would apply it.
		{class: hostileDuplicateKey, consumer: "orders", topic: events.TopicInventory, id: newID(),
			payload: fmt.Appendf(nil, `{"schema_version":1,"type":"InventoryRejected","order_id":"%s","order_id":"%s","reason":"duplicate"}`, newID(), decided), times: 1, kind: "dead_letter"},
		{class: hostileCaseKey, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: fmt.Appendf(nil, `{"schema_version":1,"type":"OrderPaid","Order_ID":"%s","lines":[{"sku":"sku-01","quantity":1}],"paid_at":"2026-01-02T03:04:05Z"}`, newID()), times: 1, kind: "dead_letter"},
		{class: hostileTrailing, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: append(paid(`[{"sku":"sku-01","quantity":1}]`), ` {"order_id":"x"}`...), times: 1, kind: "dead_letter"},
		{class: hostileSurrogate, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: paid(`[{"sku":"sku-01\ud800","quantity":1}]`), times: 1, kind: "dead_letter"},

		// Signed as orders signs: only the comparison of the record with
		// its payload can refuse them.
		{class: hostileEnvKey, consumer: "inventory", topic: events.TopicOrders, id: newID(), key: decided,
			payload: paid(`[{"sku":"sku-01","quantity":1}]`), times: 1, kind: "invalid", reason: "partition key"},
		{class: hostileEnvType, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			headers: map[string]string{outbox.TypeMetadata: events.TypeOrderCaptured},
			payload: paid(`[{"sku":"sku-01","quantity":1}]`), times: 1, kind: "invalid", reason: "type header"},
		{class: hostileEnvTopic, consumer: "inventory", topic: events.TopicOrders, id: newID(),
			payload: fmt.Appendf(nil, `{"schema_version":1,"type":"InventoryReserved","order_id":"%s","lines":[{"sku":"sku-01","quantity":1}]}`, newID()),
			times:   1, kind: "invalid", reason: "travels on"},
	}...)
	var stream string // inventory's outbox's: the harness numbers as inventory would
	if err := h.sys.Pools["inventory"].QueryRow(ctx, `SELECT id::text FROM outbox_stream`).Scan(&stream); err != nil {
		return fmt.Errorf("reading inventory's outbox stream: %w", err)
	}
	numbered := func(class string, order string, n int, breaks *judge.BreachInjected) hostileMsg {
		return hostileMsg{class: class, consumer: "orders", topic: events.TopicInventory, id: newID(),
			payload: fmt.Appendf(nil, `{"schema_version":1,"type":"InventoryReserved","order_id":"%s","lines":[{"sku":"sku-01","quantity":1}]}`, order),
			times:   1, kind: "dead_letter", seq: fmt.Sprintf("%s:%d", stream, n), breaks: breaks}
	}
	skipped, rewound := newID(), newID()
	h.msgs = append(h.msgs,
		numbered(hostileSeqSkipFirst, skipped, 1, nil),
		numbered(hostileSeqSkip, skipped, 3, &judge.BreachInjected{Kind: "gap", Expected: 2, Got: 3}),
		numbered(hostileSeqRewindFirst, rewound, 1, nil),
		numbered(hostileSeqRewindSecond, rewound, 2, nil),
		numbered(hostileSeqRewind, rewound, 2, &judge.BreachInjected{Kind: "rewind", Expected: 3, Got: 2}),
	)
	if len(h.sys.Keys) > 0 {
		// Well-formed events nobody who may sign wrote: an OrderPaid for a
		// new order (stock reserved for nobody), unsigned, signed with a
		// key no consumer trusts, and orders' real signature over another
		// payload; and the forged answer of #30, unsigned, for a decided
		// order. Each quarantined before dedupe, never applied.
		const why = "not authenticated"
		h.msgs = append(h.msgs,
			hostileMsg{class: hostileForgedUnsigned, consumer: "inventory", topic: events.TopicOrders, id: newID(),
				payload: paid(`[{"sku":"sku-01","quantity":1}]`), times: 1, kind: "invalid", reason: why, forge: forgeNone},
			hostileMsg{class: hostileForgedStranger, consumer: "inventory", topic: events.TopicOrders, id: newID(),
				payload: paid(`[{"sku":"sku-01","quantity":1}]`), times: 1, kind: "invalid", reason: why, forge: forgeStranger},
			hostileMsg{class: hostileForgedTampered, consumer: "inventory", topic: events.TopicOrders, id: newID(),
				payload: paid(`[{"sku":"sku-01","quantity":9}]`), times: 1, kind: "invalid", reason: why, forge: forgeTampered},
			hostileMsg{class: hostileForgedAnswer, consumer: "orders", topic: events.TopicInventory, id: newID(),
				payload: fmt.Appendf(nil, `{"schema_version":1,"type":"InventoryRejected","order_id":"%s","reason":"forged"}`, decided),
				times:   1, kind: "invalid", reason: why, forge: forgeNone},
		)
	}
	if h.sys.Kafka.Authenticated() {
		h.msgs = append(h.msgs,
			hostileMsg{class: hostileOtherPrincipal, consumer: "inventory", topic: events.TopicOrders, id: newID(),
				payload: paid(`[{"sku":"sku-01","quantity":1}]`), times: 1, kind: judge.KindBrokerRefused, as: "inventory"},
			hostileMsg{class: hostileNoGrants, consumer: "orders", topic: events.TopicInventory, id: newID(),
				payload: fmt.Appendf(nil, `{"schema_version":1,"type":"InventoryRejected","order_id":"%s","reason":"forged"}`, decided),
				times:   1, kind: judge.KindBrokerRefused, as: intruder},
		)
	}
	return nil
}

// sign signs msg as m.forge says.
func (h *hostile) sign(m hostileMsg, msg *message.Message) {
	switch m.forge {
	case "":
		h.sys.SignAsProducer(m.topic, msg)
	case forgeStranger:
		stranger := signature.Key{ID: system.Producers[m.topic] + "-forger", Secret: []byte(strings.Repeat("k", signature.MinSecretBytes))}
		signature.Sign(stranger, m.topic, msg.Metadata.Get(outbox.KeyMetadata), msg)
	case forgeTampered: // orders signed 2 units; the record says 9
		sent := msg.Payload
		msg.Payload = bytes.Replace(sent, []byte(`"quantity":9`), []byte(`"quantity":2`), 1)
		h.sys.SignAsProducer(m.topic, msg)
		msg.Payload = sent
	}
}

// nearLimit is an OrderPaid whose payload is just inside the consumer's
// limit (INBOX_MAX_PAYLOAD_BYTES, 65536) and whose headers bring the record
// to nearLimitBytes: the handler refuses its unknown field, and the dead
// letter must leave the payload and the headers out to fit the relay's
// limit (and the relay must still drain: nothing-lost).
func nearLimit(id string) hostileMsg {
	m := hostileMsg{class: hostileNearLimit, consumer: "inventory", topic: events.TopicOrders, id: id, times: 1, kind: "dead_letter",
		headers: map[string]string{}}
	head := `{"schema_version":1,"type":"OrderPaid","order_id":"` + id + `","lines":[{"sku":"sku-01","quantity":1}],"pad":"`
	m.payload = []byte(head + strings.Repeat("x", 65536-len(head)-2) + `"}`)
	const header = 100_000
	msg := m.message()
	for i := 0; outbox.RecordBytes(msg)+header < nearLimitBytes; i++ {
		k := fmt.Sprintf("x-pad-%d", i)
		m.headers[k] = strings.Repeat("h", header)
		msg.Metadata.Set(k, m.headers[k])
	}
	last := "x-pad-last"
	msg.Metadata.Set(last, "")
	m.headers[last] = strings.Repeat("h", nearLimitBytes-outbox.RecordBytes(msg))
	return m
}

// message is m's record: keyed as its producer would key it
// (recordKey), marked with judge.HostileHeader, with m's headers.
func (m hostileMsg) message() *message.Message {
	msg := message.NewMessage(m.id, m.payload)
	msg.Metadata.Set(outbox.KeyMetadata, m.recordKey())
	msg.Metadata.Set(judge.HostileHeader, m.class)
	for k, v := range m.headers {
		msg.Metadata.Set(k, v)
	}
	if m.seq != "" {
		msg.Metadata.Set(outbox.SequenceMetadata, m.seq)
	}
	return msg
}

// injectedBreaks are the breaks the hostile messages made in their keys'
// histories, each with the breach its consumer must record.
func (h *hostile) injectedBreaks() []judge.BreachInjected {
	var out []judge.BreachInjected
	for _, m := range h.msgs {
		if m.breaks != nil {
			b := *m.breaks
			b.Class, b.Consumer, b.MessageID = m.class, m.consumer, m.id
			out = append(out, b)
		}
	}
	return out
}

// recordKey is m's key, or the key its producer gives a record: the order
// id its payload names, so that it meets the checks behind the inbox's
// comparison of record and payload; hostile-<class> where it names none.
func (m hostileMsg) recordKey() string {
	if m.key != "" {
		return m.key
	}
	if env, ok := events.RecordEnvelope(message.NewMessage(m.id, m.payload)); ok {
		return env.Key
	}
	return judge.HostileKeyPrefix + m.class
}

// quarantinedAs is the message id its quarantine row holds.
func (m hostileMsg) quarantinedAs() string {
	if m.storedID != "" || m.id != pgTextSafe(m.id) {
		return m.storedID
	}
	return m.id
}

// pgTextSafe is s when Postgres text can hold it, "" otherwise.
func pgTextSafe(s string) string {
	if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return ""
	}
	return s
}

// send publishes every hostile message (build made them).
func (h *hostile) send(ctx context.Context) error {
	conf := kafkaconf.Sarama()
	conf.Producer.MaxMessageBytes = 1 << 20
	// The harness's own producer must outlast the faults the harness does
	// to the cluster: a killed leader fails over in ~3 s, a full-cluster
	// restart takes ~20 s; Sarama's default gives up after 3 × 100 ms (a
	// CI run lost the hostile classes to "connection refused" that way).
	conf.Producer.Retry.Max, conf.Producer.Retry.Backoff = 60, 500*time.Millisecond
	conf.Metadata.Retry.Max, conf.Metadata.Retry.Backoff = 60, 500*time.Millisecond
	pub, err := kafkaconf.Publisher(h.sys.Kafka.DirectBrokers(), conf)
	if err != nil {
		return err
	}
	defer pub.Close()
	for _, m := range h.msgs {
		if m.as != "" {
			if err := h.sendAs(ctx, m); err != nil { // hostile_broker.go
				return err
			}
			continue
		}
		for range m.times {
			msg := m.message()
			h.sign(m, msg)
			if err := pub.Publish(m.topic, msg); err != nil {
				return fmt.Errorf("publishing %s: %w", m.class, err)
			}
		}
	}
	h.sendHTTP(ctx) // hostile_http.go
	h.sent.Store(true)
	return nil
}

func (h *hostile) summary() string {
	var classes []string
	for _, m := range h.msgs {
		classes = append(classes, fmt.Sprintf("%s×%d", m.class, m.times))
	}
	for _, r := range hostileRequests() {
		classes = append(classes, r.class)
	}
	return strings.Join(classes, ", ")
}

// expect is what the judge holds m to.
func (m hostileMsg) expect() judge.HostileMessage {
	return judge.HostileMessage{Class: m.class, Consumer: m.consumer, Topic: m.topic, ID: m.id, RecordedAs: m.quarantinedAs(),
		Kind: m.kind, Reason: m.reason, Payload: m.payload, Times: m.times, As: m.as, Order: m.order}
}

// results asks the judge what became of each hostile class.
func (h *hostile) results(ctx context.Context) (map[string]judge.HostileResult, error) {
	out := map[string]judge.HostileResult{}
	h.http.mu.Lock()
	for class, r := range h.http.out {
		out[class] = r
	}
	h.http.mu.Unlock()
	for _, m := range h.msgs {
		pool := h.sys.Pools[m.consumer]
		var r judge.HostileResult
		var err error
		switch m.kind {
		case judge.KindRefusedOrRepaired:
			r, err = judge.WrongAnswerOutcome(ctx, pool, h.sys.Pools["audit"], m.expect())
		case judge.KindBrokerRefused:
			h.kafka.mu.Lock()
			refusal, sent := h.kafka.out[m.class] // hostile_broker.go
			h.kafka.mu.Unlock()
			r, err = judge.BrokerRefusedOutcome(ctx, pool, m.expect(), sent, refusal)
		default:
			r, err = judge.HostileOutcome(ctx, pool, m.expect())
		}
		if err != nil {
			return nil, err
		}
		out[m.class] = r
	}
	return out, nil
}

// refusedOthers counts the refusals, in both services, of messages that are
// not hostile: the system's own events the domain guard refused. The
// injected orders' are left out: a wrong answer applied makes the guards
// refuse the system's own events about its order (inventory's real
// answer, the OrderCaptured of a capture inventory never reserved).
func (h *hostile) refusedOthers(ctx context.Context) (int, error) {
	var ids []string
	for _, m := range h.msgs {
		ids = append(ids, m.quarantinedAs()) // as text: Postgres refuses an id that is not
	}
	total := 0
	for _, name := range []string{"orders", "inventory"} {
		var n int
		if err := h.sys.Pools[name].QueryRow(ctx, `SELECT count(*) FROM refusals WHERE NOT message_id = ANY($1) AND NOT order_id::text = ANY($2)`,
			ids, h.injected()).Scan(&n); err != nil {
			return 0, fmt.Errorf("counting %s refusals: %w", name, err)
		}
		total += n
	}
	return total, nil
}

// injected returns the orders the harness paid to inject a breach.
// None until the messages are sent (sent orders the reads after build's
// writes).
func (h *hostile) injected() []string {
	out := []string{}
	if !h.sent.Load() {
		return out
	}
	for _, m := range h.msgs {
		if m.order != "" {
			out = append(out, m.order)
		}
	}
	return out
}

// ids returns the hostile message ids (the real id the conflict class
// reuses among them: a kill on it is left out too).
func (h *hostile) ids() map[string]bool {
	ids := map[string]bool{}
	for _, m := range h.msgs {
		ids[m.id] = true
		ids[failpoint.LoggedSubject(m.id)] = true // a kill's subject, as the failpoint log writes an id that is not text
	}
	return ids
}

// done reports whether every hostile message has been dealt with (or none
// was sent yet, which the report will show).
func (h *hostile) done(ctx context.Context) bool {
	if !h.sent.Load() {
		return false
	}
	res, err := h.results(ctx)
	if err != nil {
		return false
	}
	for _, r := range res {
		if !r.Handled {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
