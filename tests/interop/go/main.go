// Command producer writes ScheduleCommand messages for the scheduler's ingestor, written from the
// "Wire format" section of the scheduler's README alone: Avro single-object encoding (C3 01, the
// little-endian CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form, the Avro binary
// body), with no Avro library and no dependency outside Go's standard library.
//
// It derives the Parsing Canonical Form from the schema file, checks that its fingerprint is the
// one the README documents, and prints one message per line on stdout as "<key hex>\t<value hex>",
// for the test to produce onto the commands topic with a plain Kafka producer.
//
// Usage: producer -schema schemas/ScheduleCommand.avsc -app interop -n 50
package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

// The fingerprint as the README gives it, in wire order.
const documentedFingerprint = "f93a707630ee844f"

// ---- CRC-64-AVRO, as the README spells it out ----

const crcEmpty uint64 = 0xc15d213aa4d7a795

var crcTable = func() [256]uint64 {
	var table [256]uint64
	for i := range table {
		fp := uint64(i)
		for j := 0; j < 8; j++ {
			fp = (fp >> 1) ^ (crcEmpty & -(fp & 1))
		}
		table[i] = fp
	}
	return table
}()

func crc64Avro(data []byte) uint64 {
	fp := crcEmpty
	for _, b := range data {
		fp = (fp >> 8) ^ crcTable[byte(fp)^b]
	}
	return fp
}

// ---- Parsing Canonical Form of a schema file ----

var primitives = map[string]bool{
	"null": true, "boolean": true, "int": true, "long": true, "float": true, "double": true,
	"bytes": true, "string": true,
}

func fullName(name, namespace string) string {
	if strings.Contains(name, ".") || namespace == "" {
		return name
	}
	return namespace + "." + name
}

func quote(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		panic(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func canonical(schema any, namespace string, out *strings.Builder) {
	switch s := schema.(type) {
	case string:
		if primitives[s] {
			out.WriteString(quote(s))
		} else {
			out.WriteString(quote(fullName(s, namespace)))
		}
	case []any:
		out.WriteString("[")
		for i, branch := range s {
			if i > 0 {
				out.WriteString(",")
			}
			canonical(branch, namespace, out)
		}
		out.WriteString("]")
	case map[string]any:
		typ, _ := s["type"].(string)
		if primitives[typ] {
			// {"type": "long", "logicalType": ...} is just "long".
			out.WriteString(quote(typ))
			return
		}
		if typ == "" {
			canonical(s["type"], namespace, out)
			return
		}
		if ns, ok := s["namespace"].(string); ok {
			namespace = ns
		}
		parts := []string{}
		if name, ok := s["name"].(string); ok {
			name = fullName(name, namespace)
			if i := strings.LastIndex(name, "."); i >= 0 {
				namespace = name[:i]
			}
			parts = append(parts, `"name":`+quote(name))
		}
		parts = append(parts, `"type":`+quote(typ))
		if fields, ok := s["fields"].([]any); ok {
			var f strings.Builder
			f.WriteString(`"fields":[`)
			for i, field := range fields {
				m := field.(map[string]any)
				if i > 0 {
					f.WriteString(",")
				}
				f.WriteString(`{"name":` + quote(m["name"].(string)) + `,"type":`)
				canonical(m["type"], namespace, &f)
				f.WriteString("}")
			}
			f.WriteString("]")
			parts = append(parts, f.String())
		}
		if symbols, ok := s["symbols"].([]any); ok {
			quoted := make([]string, len(symbols))
			for i, symbol := range symbols {
				quoted[i] = quote(symbol.(string))
			}
			parts = append(parts, `"symbols":[`+strings.Join(quoted, ",")+"]")
		}
		for _, key := range []string{"items", "values"} {
			if inner, ok := s[key]; ok {
				var f strings.Builder
				canonical(inner, namespace, &f)
				parts = append(parts, `"`+key+`":`+f.String())
			}
		}
		if size, ok := s["size"].(float64); ok {
			parts = append(parts, fmt.Sprintf(`"size":%d`, int64(size)))
		}
		out.WriteString("{" + strings.Join(parts, ",") + "}")
	default:
		panic(fmt.Sprintf("unexpected schema element %#v", schema))
	}
}

// ---- Avro binary encoding ----

type encoder struct{ buf bytes.Buffer }

func (e *encoder) long(n int64) {
	z := uint64((n << 1) ^ (n >> 63))
	for z >= 0x80 {
		e.buf.WriteByte(byte(z) | 0x80)
		z >>= 7
	}
	e.buf.WriteByte(byte(z))
}

func (e *encoder) int(n int32) { e.long(int64(n)) }

func (e *encoder) str(s string) {
	e.long(int64(len(s))) // the UTF-8 length in bytes
	e.buf.WriteString(s)
}

func (e *encoder) null() { e.long(0) } // union branch 0

func (e *encoder) optString(s *string) {
	if s == nil {
		e.null()
		return
	}
	e.long(1)
	e.str(*s)
}

func (e *encoder) optTime(t *time.Time) {
	if t == nil {
		e.null()
		return
	}
	e.long(1)
	e.long(t.UnixMicro()) // timestamp-micros
}

func (e *encoder) optLong(n *int64) {
	if n == nil {
		e.null()
		return
	}
	e.long(1)
	e.long(*n)
}

var operations = map[string]int32{"create": 0, "update": 1, "pause": 2, "resume": 3, "cancel": 4, "trigger": 5}
var kinds = map[string]int32{"immediate": 0, "delayed": 1, "cron": 2}
var misfires = map[string]int32{"fire_once": 0, "fire_all": 1, "skip": 2}
var overlaps = map[string]int32{"allow": 0, "skip": 1, "buffer_one": 2}

type Spec struct {
	Name, Kind, Handler, Payload string
	Cron                         *string
	Tz                           string
	RunAt, StartAt, EndAt        *time.Time
	MaxAttempts, TimeoutSeconds  int32
	Misfire, Overlap             string
	BackoffBaseMs, BackoffMaxMs  int32
	JitterMs                     int32
}

type Command struct {
	CommandID, ScheduleKey, App, Operation string
	Spec                                   *Spec
	ExpectedVersion                        *int64
	Actor                                  *string
}

func encode(header []byte, c Command) []byte {
	e := &encoder{}
	e.buf.Write(header)
	e.str(c.CommandID)
	e.str(c.ScheduleKey)
	e.str(c.App)
	e.int(operations[c.Operation])
	if c.Spec == nil {
		e.null()
	} else {
		s := c.Spec
		e.long(1)
		e.str(s.Name)
		e.int(kinds[s.Kind])
		e.str(s.Handler)
		e.str(s.Payload)
		e.optString(s.Cron)
		e.str(s.Tz)
		e.optTime(s.RunAt)
		e.optTime(s.StartAt)
		e.optTime(s.EndAt)
		e.int(s.MaxAttempts)
		e.int(s.TimeoutSeconds)
		e.int(misfires[s.Misfire])
		e.int(overlaps[s.Overlap])
		e.int(s.BackoffBaseMs)
		e.int(s.BackoffMaxMs)
		e.int(s.JitterMs)
	}
	e.optLong(c.ExpectedVersion)
	e.optString(c.Actor)
	return e.buf.Bytes()
}

func ptr[T any](v T) *T { return &v }

func defaults(s Spec) *Spec {
	if s.Payload == "" {
		s.Payload = "{}"
	}
	if s.Tz == "" {
		s.Tz = "UTC"
	}
	if s.MaxAttempts == 0 {
		s.MaxAttempts = 3
	}
	if s.TimeoutSeconds == 0 {
		s.TimeoutSeconds = 300
	}
	if s.Misfire == "" {
		s.Misfire = "fire_once"
	}
	if s.Overlap == "" {
		s.Overlap = "allow"
	}
	if s.BackoffBaseMs == 0 {
		s.BackoffBaseMs = 1000
	}
	if s.BackoffMaxMs == 0 {
		s.BackoffMaxMs = 300000
	}
	return &s
}

func main() {
	schemaPath := flag.String("schema", "schemas/ScheduleCommand.avsc", "the ScheduleCommand schema file")
	app := flag.String("app", "interop", "the app of every command")
	n := flag.Int("n", 50, "how many cron schedules to create")
	flag.Parse()

	text, err := os.ReadFile(*schemaPath)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var schema any
	if err := json.Unmarshal(text, &schema); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var form strings.Builder
	canonical(schema, "", &form)
	fp := crc64Avro([]byte(form.String()))
	header := []byte{0xc3, 0x01}
	for i := 0; i < 8; i++ {
		header = append(header, byte(fp>>(8*i))) // little-endian
	}
	if got := hex.EncodeToString(header[2:]); got != documentedFingerprint {
		fmt.Fprintf(os.Stderr, "fingerprint %s differs from the documented %s; canonical form:\n%s\n", got, documentedFingerprint, form.String())
		os.Exit(3)
	}

	actor := ptr("go-producer")
	commands := []Command{}
	for i := 0; i < *n; i++ {
		commands = append(commands, Command{
			CommandID: fmt.Sprintf("go-create-%d", i), ScheduleKey: fmt.Sprintf("go-cron-%d", i), App: *app,
			Operation: "create",
			Spec: defaults(Spec{
				Kind: "cron", Handler: "builtin:noop", Cron: ptr(fmt.Sprintf("%d 4 * * *", i%60)),
				Tz: "America/New_York", Payload: fmt.Sprintf(`{"i":%d,"from":"go"}`, i),
				MaxAttempts: int32(2 + i%3), TimeoutSeconds: 120, Misfire: "skip", Overlap: "buffer_one",
			}),
		})
	}
	runAt := time.Date(2030, 6, 1, 12, 34, 56, 789012000, time.UTC)
	commands = append(commands,
		Command{
			CommandID: "go-delayed", ScheduleKey: "go-delayed", App: *app, Operation: "create", Actor: actor,
			Spec: defaults(Spec{Name: "Zeitplan für Grüße ✓", Kind: "delayed", Handler: "builtin:sleep",
				Payload: `{"seconds":1}`, RunAt: &runAt}),
		},
		Command{
			CommandID: "go-bounded", ScheduleKey: "go-bounded", App: *app, Operation: "create",
			Spec: defaults(Spec{Kind: "cron", Handler: "builtin:noop", Cron: ptr("*/5 * * * *"),
				StartAt: ptr(time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC)),
				EndAt:   ptr(time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC))}),
		},
		Command{CommandID: "go-pause-0", ScheduleKey: "go-cron-0", App: *app, Operation: "pause", Actor: actor},
		Command{
			CommandID: "go-update-1", ScheduleKey: "go-cron-1", App: *app, Operation: "update",
			ExpectedVersion: ptr(int64(1)), Actor: actor,
			Spec: defaults(Spec{Name: "renamed by go", Kind: "cron", Handler: "builtin:noop",
				Cron: ptr("45 23 * * *"), Tz: "Asia/Kolkata", Payload: `{"updated":true}`}),
		},
	)
	if *n > 0 {
		commands = append(commands, commands[0]) // a producer's retry: the same command id again
	}

	for _, c := range commands {
		key := c.App + "/" + c.ScheduleKey
		fmt.Printf("%s\t%s\n", hex.EncodeToString([]byte(key)), hex.EncodeToString(encode(header, c)))
	}
}
