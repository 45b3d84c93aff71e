package dnstap

import (
	"bytes"
	"testing"

	tap "github.com/dnstap/golang-dnstap"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// oracle is extract done the obvious way: proto.Unmarshal into tap.Dnstap
// and the getters. extract must agree with it on every input.
func oracle(frame []byte) ([]byte, verdict) {
	var d tap.Dnstap
	if err := proto.Unmarshal(frame, &d); err != nil {
		return nil, verdictBadProtobuf
	}
	m := d.GetMessage()
	if d.GetType() != tap.Dnstap_MESSAGE || m == nil || m.GetType() != tap.Message_CLIENT_RESPONSE {
		return nil, verdictNotClientResponse
	}
	if m.ResponseMessage == nil {
		return nil, verdictNoResponseMessage
	}
	return m.ResponseMessage, verdictResponse
}

// pb builds protobufs by hand, for encodings proto.Marshal never makes.
type pb []byte

func (b pb) varint(num protowire.Number, v uint64) pb {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

func (b pb) bytes(num protowire.Number, v []byte) pb {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

func (b pb) raw(v ...byte) pb { return append(b, v...) }

// extractCases are protobufs with the verdict they deserve; the seeds of
// FuzzDnstapMessage too.
func extractCases(t testing.TB) []struct {
	name string
	in   []byte
	want verdict
	resp []byte
} {
	resp := reply(t, "www.example.com")
	const cr, cq = uint64(tap.Message_CLIENT_RESPONSE), uint64(tap.Message_CLIENT_QUERY)
	msg := func(typ uint64, withResp bool) pb {
		m := pb(nil).varint(fieldMessageType, typ).varint(2, 1).bytes(4, []byte{127, 0, 0, 1})
		if withResp {
			m = m.bytes(fieldMessageResponse, resp)
		}
		return m
	}
	envelope := func(m []byte) pb {
		return pb(nil).bytes(1, []byte("node")).bytes(fieldDnstapMessage, m).varint(fieldDnstapType, 1)
	}
	return []struct {
		name string
		in   []byte
		want verdict
		resp []byte
	}{
		{"marshalled client response", tapFrame(t, tap.Message_CLIENT_RESPONSE, resp), verdictResponse, resp},
		{"hand-made client response", envelope(msg(cr, true)), verdictResponse, resp},
		{"client query", tapFrame(t, tap.Message_CLIENT_QUERY, nil), verdictNotClientResponse, nil},
		{"forwarder response", tapFrame(t, tap.Message_FORWARDER_RESPONSE, resp), verdictNotClientResponse, nil},
		{"no response message", tapFrame(t, tap.Message_CLIENT_RESPONSE, nil), verdictNoResponseMessage, nil},
		{"empty response message", envelope(pb(nil).varint(fieldMessageType, cr).bytes(fieldMessageResponse, nil)), verdictResponse, []byte{}},
		{"empty", nil, verdictBadProtobuf, nil},
		{"no message", pb(nil).varint(fieldDnstapType, 1), verdictNotClientResponse, nil},
		{"dnstap type missing", pb(nil).bytes(fieldDnstapMessage, msg(cr, true)), verdictBadProtobuf, nil},
		{"message type missing", pb(nil).bytes(fieldDnstapMessage, pb(nil).bytes(fieldMessageResponse, resp)).varint(fieldDnstapType, 1), verdictBadProtobuf, nil},
		{"unknown dnstap type", pb(nil).bytes(fieldDnstapMessage, msg(cr, true)).varint(fieldDnstapType, 2), verdictNotClientResponse, nil},
		{"type as int32 truncation", pb(nil).bytes(fieldDnstapMessage, msg(1<<32|cr, true)).varint(fieldDnstapType, 1<<32|1), verdictResponse, resp},
		{"last type wins", envelope(pb(nil).varint(fieldMessageType, cr).bytes(fieldMessageResponse, resp).varint(fieldMessageType, cq)), verdictNotClientResponse, nil},
		{"messages merge", pb(nil).bytes(fieldDnstapMessage, msg(cr, false)).varint(fieldDnstapType, 1).bytes(fieldDnstapMessage, pb(nil).bytes(fieldMessageResponse, resp)), verdictResponse, resp},
		{"required type in the second message", pb(nil).bytes(fieldDnstapMessage, pb(nil).bytes(fieldMessageResponse, resp)).bytes(fieldDnstapMessage, pb(nil).varint(fieldMessageType, cr)).varint(fieldDnstapType, 1), verdictResponse, resp},
		{"last response wins", envelope(msg(cr, true).bytes(fieldMessageResponse, []byte("second"))), verdictResponse, []byte("second")},
		{"type with the wrong wire type is unknown", pb(nil).bytes(fieldDnstapMessage, msg(cr, true)).bytes(fieldDnstapType, []byte{1}), verdictBadProtobuf, nil},
		{"message with the wrong wire type is unknown", pb(nil).varint(fieldDnstapMessage, 3).varint(fieldDnstapType, 1), verdictNotClientResponse, nil},
		{"response with the wrong wire type is unknown", envelope(pb(nil).varint(fieldMessageType, cr).varint(fieldMessageResponse, 7)), verdictNoResponseMessage, nil},
		{"unknown group skipped", envelope(msg(cr, true)).raw(0x83, 0x01, 0x08, 0x01, 0x84, 0x01), verdictResponse, resp},
		{"stray end group", envelope(msg(cr, true)).raw(0x84, 0x01), verdictBadProtobuf, nil},
		{"largest field number", envelope(msg(cr, true)).raw(0xf8, 0xff, 0xff, 0xff, 0x0f, 0x00), verdictResponse, resp},
		{"field number zero", envelope(msg(cr, true)).raw(0x00, 0x00), verdictBadProtobuf, nil},
		{"field number too large", envelope(msg(cr, true)).raw(0x80, 0x80, 0x80, 0x80, 0x10, 0x00), verdictBadProtobuf, nil},
		{"truncated length", envelope(msg(cr, true)).raw(0x0a, 0x05, 'x'), verdictBadProtobuf, nil},
		{"bad wire type", envelope(msg(cr, true)).raw(0x0f), verdictBadProtobuf, nil},
		{"garbage", []byte("\xff\xff\xff\xff not a protobuf"), verdictBadProtobuf, nil},
		{"malformed inside the message", pb(nil).bytes(fieldDnstapMessage, msg(cr, true).raw(0x80)).varint(fieldDnstapType, 1), verdictBadProtobuf, nil},
	}
}

func TestExtract(t *testing.T) {
	for _, tt := range extractCases(t) {
		t.Run(tt.name, func(t *testing.T) {
			resp, v := extract(tt.in)
			if v != tt.want || !bytes.Equal(resp, tt.resp) || (tt.resp != nil) != (resp != nil) {
				t.Errorf("extract = %d %x, want %d %x", v, resp, tt.want, tt.resp)
			}
			oresp, ov := oracle(tt.in)
			if ov != v || !bytes.Equal(oresp, resp) {
				t.Errorf("proto.Unmarshal says %d %x", ov, oresp)
			}
		})
	}
}

func TestExtractAllocs(t *testing.T) {
	frame := tapFrame(t, tap.Message_CLIENT_RESPONSE, reply(t, "www.example.com"))
	if n := testing.AllocsPerRun(100, func() { extract(frame) }); n != 0 {
		t.Errorf("extract allocates %v times", n)
	}
}

// BenchmarkExtract and BenchmarkProtoUnmarshal compare the two ways to the
// reply of one CoreDNS CLIENT_RESPONSE.
func BenchmarkExtract(b *testing.B) {
	frame := tapFrame(b, tap.Message_CLIENT_RESPONSE, reply(b, "www.example.com"))
	b.ReportAllocs()
	for b.Loop() {
		if _, v := extract(frame); v != verdictResponse {
			b.Fatal(v)
		}
	}
}

func BenchmarkProtoUnmarshal(b *testing.B) {
	frame := tapFrame(b, tap.Message_CLIENT_RESPONSE, reply(b, "www.example.com"))
	b.ReportAllocs()
	for b.Loop() {
		if _, v := oracle(frame); v != verdictResponse {
			b.Fatal(v)
		}
	}
}
