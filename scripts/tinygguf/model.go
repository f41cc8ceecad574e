package main

import (
	"fmt"
	"strings"
)

// The tiny model's shape (docs/real-engine.md): a llama with random
// weights, small enough (~0.5 MB) to generate on every run and fast enough
// on one CPU core that a request takes milliseconds per token.
const (
	nLayer   = 2
	nEmbd    = 64
	nHead    = 4
	nFF      = 128
	nCtx     = 32768
	rmsEps   = 1e-5
	ropeBase = 10000
)

// SentencePiece token types (llama.cpp's llama_token_type).
const (
	tokNormal  int32 = 1
	tokUnknown int32 = 2
	tokControl int32 = 3
	tokByte    int32 = 6
)

const (
	unkID = 0
	bosID = 1
	eosID = 2
	// firstByteID is <0x00>; the 256 byte tokens follow it.
	firstByteID = 3
	// firstPieceID is the first word piece, after the byte tokens.
	firstPieceID = firstByteID + 256
)

// sp is SentencePiece's word-boundary mark, U+2581.
const sp = "\u2581"

// words are the word pieces sampling chooses from: the output reads as
// (meaningless) English. attractor is the one greedy decoding always picks.
var words = strings.Fields(`the hello world a an and of to in is it that this for on with as be at by
from or not are was were will can you we they he she i my your our time day way
model token stream reply answer agent engine proxy request test code file line
data value result check run build start stop fast slow small large first last
next good well more most some any each all one two three four five new old
here there now then when where what which who how why yes no ok sure please
thanks done ready go make see look find use write read send keep give take
tell ask work call try need want like know think say get put set let open`)

const attractor = "the"

// letters and marks are single-character pieces: with them common prompt
// text tokenizes without byte fallback, and they may be sampled too.
const (
	letters = "abcdefghijklmnopqrstuvwxyz"
	marks   = ".,!?:;'-"
)

// vocab is the token table: strings, scores and types, in id order.
type vocab struct {
	Tokens []string
	Scores []float32
	Types  []int32
}

func (v *vocab) add(tok string, score float32, typ int32) {
	v.Tokens = append(v.Tokens, tok)
	v.Scores = append(v.Scores, score)
	v.Types = append(v.Types, typ)
}

// newVocab builds the byte-fallback SentencePiece vocabulary: <unk>, <s>,
// </s>, <0x00>…<0xFF>, then the word pieces. Any text tokenizes (bytes as
// the fallback); the model samples only word pieces and </s>.
func newVocab() *vocab {
	v := &vocab{}
	v.add("<unk>", 0, tokUnknown)
	v.add("<s>", 0, tokControl)
	v.add("</s>", 0, tokControl)
	for b := range 256 {
		v.add(fmt.Sprintf("<0x%02X>", b), 0, tokByte)
	}
	score := float32(-1)
	next := func(tok string) {
		v.add(tok, score, tokNormal)
		score--
	}
	next(sp)
	for _, w := range words {
		next(sp + w)
	}
	for _, c := range letters {
		next(string(c))
	}
	for _, c := range marks {
		next(string(c))
	}
	return v
}

// kind is how the output layer treats a token (see bias below).
type kind int

const (
	kindNever     kind = iota // special and byte tokens: never sampled
	kindEOS                   // </s>: sampled now and then, so answers end
	kindAttractor             // the greedy choice at every step
	kindWord                  // ▁word pieces
	kindChar                  // letters, marks and ▁ alone: rarer than words
)

func (v *vocab) kind(id int) kind {
	switch {
	case id == eosID:
		return kindEOS
	case id < firstPieceID:
		return kindNever
	case v.Tokens[id] == sp+attractor:
		return kindAttractor
	case strings.HasPrefix(v.Tokens[id], sp) && len(v.Tokens[id]) > len(sp):
		return kindWord
	default:
		return kindChar
	}
}
