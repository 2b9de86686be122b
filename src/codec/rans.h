// rANS entropy coding of integer symbol streams.
//
// Written by hand because it is the product: a 32-bit rANS with several
// interleaved states (lanes), 16-bit renormalisation, 12-bit probabilities and
// a table-driven decoder (one table lookup per symbol, no search, no per-bit
// loop). Symbols are non-negative integers; values at or above the stream's
// escape threshold are coded as an escape symbol plus a varint in a side
// buffer, so nothing is ever clipped.
//
// A stream is self-describing (docs/FORMAT.md, "Symbol streams"): frequency
// table, escape threshold, lane count, payload length, escape bytes, payload.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "cachegen/status.h"
#include "common/bytes.h"

namespace cachegen::rans {

constexpr uint32_t kProbBits = 12;
constexpr uint32_t kProbScale = 1u << kProbBits;
constexpr uint32_t kMaxAlphabet = 256;  // direct symbols incl. the escape symbol
constexpr uint32_t kDefaultLanes = 8;
constexpr uint32_t kMaxLanes = 32;

struct EncodeOptions {
  uint32_t lanes = kDefaultLanes;  // 1..kMaxLanes
  // A stream carrying less than this many bytes of coded information is
  // written with one lane (0: never). Each lane's final state costs about 3
  // bytes beyond the information it carries: on streams of a few hundred bytes
  // (small heads, short chunks) 8 lanes cost several percent of the size, while
  // long streams want 8 lanes for the AVX2 decoders.
  uint32_t single_lane_below_bytes = 0;
};

// Appends one stream coding `symbols` to out. Returns how many of the bytes
// written are stream header (mode, frequency table, lengths): side information.
size_t EncodeStream(std::span<const uint32_t> symbols, ByteWriter& out, const EncodeOptions& options = {});

// Adds to histogram[min(v, size - 1)] one count per symbol v (size >= 1):
// the histograms the estimates take. Branch-free, several sub-tables, so runs
// of equal symbols do not serialise on one counter.
void CountSymbols(std::span<const uint32_t> symbols, std::span<uint64_t> histogram);

// A stream's symbol counts as the coder takes them: [v] for v < 256, [256]
// for all larger values (CountSymbols with 257 bins). Callers that count
// anyway (rate control) pass them to the overloads below instead of having
// the symbols counted again.
using SymbolCounts = std::array<uint64_t, 257>;
// EncodeStream given the symbols' counts.
size_t EncodeStream(std::span<const uint32_t> symbols, const SymbolCounts& counts, ByteWriter& out,
                    const EncodeOptions& options = {});

// Bytes EncodeStream would append for symbols with this histogram
// (histogram[v] = count of value v; values beyond the histogram's end are not
// allowed), computed without encoding: used by rate control. Exact to within
// the rANS flush bytes (a few bytes per lane).
uint64_t EstimateStreamBytes(std::span<const uint64_t> histogram, const EncodeOptions& options = {});

// The same from the symbols themselves (any values); with scale != 1 the
// symbols are a sample and every count is multiplied by scale first, so a
// sample estimates a stream that many times longer (its table, header and
// flush bytes counted once).
uint64_t EstimateStreamBytes(std::span<const uint32_t> symbols, double scale, const EncodeOptions& options = {});
uint64_t EstimateStreamBytes(std::span<const uint32_t> symbols, const SymbolCounts& counts, double scale,
                             const EncodeOptions& options = {});

// A frequency table known to both sides (a model profile's, FORMAT.md
// ".cgprof"): escape threshold E in [2, 255] and freq[0..E], each >= 1 (so any
// value can be coded), summing to kProbScale.
struct FreqTable {
  uint32_t escape = 0;
  std::array<uint32_t, kMaxAlphabet> freq{};
};
// Builds such a table from value counts (values >= E share the escape symbol),
// E = min(255, max(2, largest value with a count + 1)); every symbol gets at
// least 1.
FreqTable MakeFreqTable(std::span<const uint64_t> histogram);
// Appends a stream in table form (FORMAT.md, mode 3 "profile table"): like
// EncodeStream but the frequency table is not written; empty and constant
// streams keep modes 0 and 1. Returns the header bytes written.
size_t EncodeStreamWithTable(std::span<const uint32_t> symbols, const FreqTable& table, ByteWriter& out,
                             const EncodeOptions& options = {});
// Bytes EncodeStreamWithTable would append for this histogram (same accuracy
// as EstimateStreamBytes).
uint64_t EstimateStreamBytesWithTable(std::span<const uint64_t> histogram, const FreqTable& table,
                                      const EncodeOptions& options = {});
// The same from the symbols, scaled like EstimateStreamBytes(symbols, scale).
uint64_t EstimateStreamBytesWithTable(std::span<const uint32_t> symbols, const FreqTable& table, double scale,
                                      const EncodeOptions& options = {});
// Table form with a cycle of tables (a profile with channel classes,
// FORMAT.md ".cgprof" version 4): symbol i is coded with
// *cycle[i % cycle.size()]. Same bytes as EncodeStreamWithTable (mode 3;
// modes 0 and 1 for empty and constant streams); the tables may have
// different escape thresholds. A cycle of one table, or of one table
// repeated, writes exactly what EncodeStreamWithTable writes.
// What coding symbols with a cycle of tables takes, from one pass over them:
// whether they are all one value (the first), the information in bits and the
// escape area's bytes. Rate control computes it for its estimate and gives it
// to the encoder, which would otherwise make the same pass for its lane count.
struct TableStreamCost {
  bool constant = true;
  uint32_t first = 0;
  double bits = 0;
  uint64_t escape_bytes = 0;
};
TableStreamCost CostWithTables(std::span<const uint32_t> symbols, std::span<const FreqTable* const> cycle);
// With `cost` (CostWithTables of the same symbols and cycle) the pass is not
// made again; the bytes are the same.
size_t EncodeStreamWithTables(std::span<const uint32_t> symbols, std::span<const FreqTable* const> cycle,
                              ByteWriter& out, const EncodeOptions& options = {},
                              const TableStreamCost* cost = nullptr);
// Bytes EncodeStreamWithTables would append, scaled like
// EstimateStreamBytesWithTable(symbols, table, scale).
uint64_t EstimateStreamBytesWithTables(std::span<const uint32_t> symbols, std::span<const FreqTable* const> cycle,
                                       double scale, const EncodeOptions& options = {});
// The same from the symbols' cost (n symbols, scale 1).
uint64_t EstimateStreamBytesWithTables(const TableStreamCost& cost, size_t n, const EncodeOptions& options = {});
// The decoder's form of a FreqTable: one entry per slot (TableForm::kSymbols).
// escape: the symbol whose value continues in the escape area, or
// kNoEscape when no slot decodes to it (its frequency is 0).
inline constexpr uint32_t kNoEscape = UINT32_MAX;
struct DecodeTable {
  alignas(64) uint32_t entry[kProbScale];
  uint32_t escape = 0;
};
void BuildDecodeTable(const FreqTable& table, DecodeTable* out);
// The same table in form TableForm::kZigZagValues (kProbScale entries), for
// decoders that consume values as they decode (the fused section decoder).
void BuildValueTable(const FreqTable& table, uint32_t* entries);
// Reads a stream written by EncodeStreamWithTables with the same cycle (as
// decode tables) into out (exactly out.size() symbols). Untrusted input, as
// DecodeStream; a mode-2 stream (inline table) is kCorrupt here.
Status DecodeStreamWithTables(ByteReader& in, std::span<const DecodeTable* const> cycle, std::span<uint32_t> out);
// The same in two steps, so that a caller can decode several streams
// together (streams of one length, lane count and period in lockstep
// groups). ParseStreamWithTables validates
// the header of a stream of n symbols and keeps spans into `in`'s bytes and
// the cycle (all of which must outlive the decode).
struct TableStream {
  size_t n = 0;
  uint8_t mode = 0;  // kModeEmpty, kModeConstant or kModeTable
  uint32_t constant = 0;
  uint32_t lanes = 0;
  uint32_t state[kMaxLanes];
  std::span<const uint8_t> esc, payload;
  std::span<const DecodeTable* const> cycle;
  uint32_t* out = nullptr;
};
Status ParseStreamWithTables(ByteReader& in, std::span<const DecodeTable* const> cycle, std::span<uint32_t> out,
                             TableStream* s);
// Decodes each parsed stream into its out; the first failure is returned.
// The one rANS decoder: DecodeParsed and DecodeStream come here too.
Status DecodeStreamsWithTables(std::span<TableStream* const> streams);

// Stream mode bytes (FORMAT.md "Symbol streams").
constexpr uint8_t kModeEmpty = 0;     // no symbols; nothing follows
constexpr uint8_t kModeConstant = 1;  // varint value; every symbol equals it
constexpr uint8_t kModeRans = 2;      // table + lanes + escape area + payload
constexpr uint8_t kModeTable = 3;     // as kModeRans with a table both sides know (not written)

// Reads one stream of exactly out.size() symbols from in. Untrusted input:
// any malformed table, payload or escape data is a kCorrupt Status.
Status DecodeStream(ByteReader& in, std::span<uint32_t> out);

// The same in two steps, so a caller can decode several streams together
// (8-lane streams in AVX2 lockstep groups, one-lane streams in scalar
// lockstep groups, to hide each stream's chain of dependent steps).
// ParseStream validates the header of a stream of n symbols, builds its
// decode table and keeps spans into `in`'s bytes (which must outlive it).
// Layout of ParsedStream::table entries.
enum class TableForm : uint8_t {
  // symbol (8 bits) | freq - 1 (12) | slot offset (12): what DecodeParsed decodes.
  kSymbols,
  // slot offset (12) | freq - 1 (12) | value (8): value is a direct symbol's
  // zigzag-decoded signed value (symbols below the escape symbol are <= 254,
  // so values lie in [-127, 127]) and -128 for the escape symbol. For
  // decoders that consume values as they are decoded (rans_avx2.h
  // Round8Values); DecodeParsed does not take such streams.
  kZigZagValues,
};

struct ParsedStream {
  // Entries of `form`; table.escape is E when E's frequency is not 0, else
  // kNoEscape (DecodeParsed decodes the stream as the cycle of this one table).
  DecodeTable table;
  alignas(32) uint32_t state[kMaxLanes];
  size_t n = 0;
  uint8_t mode = 0;
  uint32_t constant = 0;  // constant mode
  uint32_t escape = 0;    // rANS mode: escape symbol E, lanes, areas
  uint32_t lanes = 0;
  TableForm form = TableForm::kSymbols;
  std::span<const uint8_t> esc, payload;
};
Status ParseStream(ByteReader& in, size_t n, ParsedStream* s, TableForm form = TableForm::kSymbols);
// The header checks of ParseStream alone (no decode table is built), for
// decoders that build their own tables (the CUDA decoder's plan). Initial
// lane states are checked too; payload holds them, then the body words.
struct StreamHeader {
  uint8_t mode = 0;
  uint32_t constant = 0;
  uint32_t escape = 0;
  bool escape_used = false;
  uint32_t lanes = 0;
  std::array<uint32_t, kMaxAlphabet> freq{};  // freq[0..escape]
  std::span<const uint8_t> esc, payload;
};
Status ParseStreamHeader(ByteReader& in, size_t n, StreamHeader* h);
// The header of a table-form stream (modes 0, 1 and 3; mode 2 is corrupt
// here): mode, constant, lanes, escape area and payload (no table; escape
// and escape_used are the tables' to say).
Status ParseTableStreamHeader(ByteReader& in, size_t n, StreamHeader* h);
// Decodes each parsed stream into outs[k] (streams[k]->n symbols), each as
// the cycle of its one table (DecodeStreamsWithTables). Every payload check
// of DecodeStream applies; the first failure is returned.
Status DecodeParsed(std::span<ParsedStream* const> streams, std::span<uint32_t* const> outs);

}  // namespace cachegen::rans
