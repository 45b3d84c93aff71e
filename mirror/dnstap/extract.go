package dnstap

import (
	"google.golang.org/protobuf/encoding/protowire"

	tap "github.com/dnstap/golang-dnstap"
)

// Field numbers of dnstap.proto (github.com/dnstap/golang-dnstap v0.4.0).
const (
	fieldDnstapMessage   protowire.Number = 14 // Dnstap.message: optional Message
	fieldDnstapType      protowire.Number = 15 // Dnstap.type: required Type
	fieldMessageType     protowire.Number = 1  // Message.type: required Type
	fieldMessageResponse protowire.Number = 14 // Message.response_message: optional bytes
)

// verdict is what extract makes of one dnstap frame.
type verdict uint8

const (
	verdictResponse          verdict = iota // a CLIENT_RESPONSE with its wire-format reply
	verdictNotClientResponse                // not a MESSAGE, no Message, or a Message of another type
	verdictNoResponseMessage                // a CLIENT_RESPONSE without the reply (dnstap without "full")
	verdictBadProtobuf                      // not a valid dnstap.Dnstap protobuf
)

// extract finds the wire-format reply in a dnstap.Dnstap protobuf if it is
// a CLIENT_RESPONSE, without allocating: resp aliases frame.
//
// It walks the protobuf with protowire instead of unmarshalling it into
// tap.Dnstap, which would allocate the Dnstap, the Message and a copy of
// every bytes field for each reply mirrored. Its judgement is that of
// proto.Unmarshal into tap.Dnstap followed by the getters, case for case
// (FuzzDnstapMessage checks this against proto.Unmarshal):
//   - malformed wire data, field numbers outside [1, 2^29-1], an END_GROUP
//     without its start, or a required type missing from the (merged)
//     Dnstap or Message are verdictBadProtobuf;
//   - a known field with an unexpected wire type is an unknown field;
//   - a repeated scalar field counts as its last value, enums truncated to
//     int32 as protobuf-go stores them, and repeated Message fields merge;
//   - a present but empty response_message is still present.
func extract(frame []byte) (resp []byte, v verdict) {
	var (
		dtype, mtype       int32
		hasDtype, hasMtype bool
		hasMsg, hasResp    bool
	)
	err := walk(frame, func(num protowire.Number, typ protowire.Type, b []byte) int {
		switch {
		case num == fieldDnstapType && typ == protowire.VarintType:
			x, n := protowire.ConsumeVarint(b)
			dtype, hasDtype = int32(x), n >= 0
			return n
		case num == fieldDnstapMessage && typ == protowire.BytesType:
			m, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return n
			}
			hasMsg = true
			err := walk(m, func(num protowire.Number, typ protowire.Type, b []byte) int {
				switch {
				case num == fieldMessageType && typ == protowire.VarintType:
					x, n := protowire.ConsumeVarint(b)
					mtype, hasMtype = int32(x), n >= 0
					return n
				case num == fieldMessageResponse && typ == protowire.BytesType:
					r, n := protowire.ConsumeBytes(b)
					if n >= 0 {
						resp, hasResp = r, true
					}
					return n
				}
				return protowire.ConsumeFieldValue(num, typ, b)
			})
			if err {
				return -1
			}
			return n
		}
		return protowire.ConsumeFieldValue(num, typ, b)
	})
	switch {
	case err, !hasDtype, hasMsg && !hasMtype:
		return nil, verdictBadProtobuf
	case tap.Dnstap_Type(dtype) != tap.Dnstap_MESSAGE || !hasMsg || tap.Message_Type(mtype) != tap.Message_CLIENT_RESPONSE:
		return nil, verdictNotClientResponse
	case !hasResp:
		return nil, verdictNoResponseMessage
	}
	return resp, verdictResponse
}

// walk calls field for every field of the message b, with the bytes after
// its tag; field returns how many of them the value took, or a negative
// number when it is malformed. walk reports whether b is malformed.
func walk(b []byte, field func(num protowire.Number, typ protowire.Type, b []byte) int) (malformed bool) {
	for len(b) > 0 {
		tag, n := protowire.ConsumeVarint(b)
		if n < 0 {
			return true
		}
		b = b[n:]
		// protobuf-go checks the number before anything else; the wire
		// type's three bits cannot be out of range.
		num, typ := tag>>3, protowire.Type(tag&7)
		if num < uint64(protowire.MinValidNumber) || num > uint64(protowire.MaxValidNumber) {
			return true
		}
		if typ == protowire.EndGroupType {
			return true // no group is open at a message's top level
		}
		n = field(protowire.Number(num), typ, b)
		if n < 0 {
			return true
		}
		b = b[n:]
	}
	return false
}
