#include "lockstep/data/idx.h"

#include <zlib.h>

#include <algorithm>

#include <optional>

#include "lockstep/core/error.h"
#include "lockstep/io/atomic_file.h"

namespace lockstep::data {
namespace {

// Larger payloads are a corrupt header, not a dataset we could hold in memory.
constexpr uint64_t kMaxPayloadBytes = 10'000'000'000ull;
constexpr int kMaxDims = 4;

std::string type_name(uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "short";
    case 0x0C:
      return "int";
    case 0x0D:
      return "float";
    case 0x0E:
      return "double";
    default:
      return "unknown";
  }
}

std::string hex(uint8_t v) {
  const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[v >> 4] + digits[v & 15];
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

struct Header {
  std::vector<int64_t> dims;
  uint64_t header_bytes = 0;
  uint64_t payload_bytes = 0;
};

// Parses the header when `bytes` holds enough of it; nullopt while more bytes are needed.
std::optional<Header> parse_header(const std::string& bytes, const std::string& origin) {
  if (bytes.size() < 4) return std::nullopt;
  const auto* b = reinterpret_cast<const uint8_t*>(bytes.data());
  LOCKSTEP_THROW_IF_NOT(b[0] == 0 && b[1] == 0, CorruptInput, origin, ": not an IDX file (magic starts ", hex(b[0]),
                        " ", hex(b[1]), ", expected 0x00 0x00)");
  LOCKSTEP_THROW_IF_NOT(b[2] == 0x08, CorruptInput, origin, ": unsupported IDX element type ", hex(b[2]), " (",
                        type_name(b[2]), "); supported: 0x08 (unsigned byte)");
  const int ndim = b[3];
  LOCKSTEP_THROW_IF_NOT(ndim >= 1 && ndim <= kMaxDims, CorruptInput, origin, ": IDX has ", ndim,
                        " dimensions; expected 1 to ", kMaxDims);
  Header h;
  h.header_bytes = 4 + 4 * static_cast<uint64_t>(ndim);
  if (bytes.size() < h.header_bytes) return std::nullopt;
  uint64_t total = 1;
  for (int i = 0; i < ndim; ++i) {
    const uint8_t* d = b + 4 + 4 * static_cast<std::ptrdiff_t>(i);
    const uint64_t dim = (uint64_t(d[0]) << 24) | (uint64_t(d[1]) << 16) | (uint64_t(d[2]) << 8) | d[3];
    h.dims.push_back(static_cast<int64_t>(dim));
    LOCKSTEP_THROW_IF_NOT(dim > 0, CorruptInput, origin, ": IDX dimension ", i, " is zero");
    // Four u32 factors can overflow u64, so stop as soon as the running product is absurd.
    LOCKSTEP_THROW_IF_NOT(dim <= kMaxPayloadBytes / total, CorruptInput, origin, ": IDX dimensions ", dims_text(h.dims),
                          "... exceed ", kMaxPayloadBytes, " bytes");
    total *= dim;
  }
  h.payload_bytes = total;
  return h;
}

std::string trailing_message(const std::string& origin, const Header& h, uint64_t got) {
  return detail::concat(origin, ": IDX payload has ", got, " bytes but dimensions ", dims_text(h.dims), " need ",
                        h.payload_bytes, " (trailing bytes)");
}

// Inflates a gzip file (possibly several members), stopping early once it is longer than the
// IDX header says it should be, so a corrupt or hostile file cannot exhaust memory.
std::string gunzip(const std::string& in, const std::string& origin) {
  z_stream zs{};
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) throw Error("zlib inflateInit2 failed");
  struct End {
    z_stream* zs;
    ~End() { inflateEnd(zs); }
  } end{&zs};
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());  // IDX files are far below 4 GiB compressed
  LOCKSTEP_THROW_IF_NOT(in.size() == zs.avail_in, CorruptInput, origin, ": gzip file too large");
  std::string out;
  std::optional<Header> header;
  char buf[1 << 16];
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(buf);
    zs.avail_out = sizeof buf;
    const int rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      throw CorruptInput(detail::concat(origin, ": corrupt gzip data (zlib: ", zs.msg ? zs.msg : zError(rc), ")"));
    }
    out.append(buf, sizeof buf - zs.avail_out);
    if (!header) {
      header = parse_header(out, origin);
      // Reserved as the data arrive, never from the header's claim alone: 21 bytes of gzip can
      // claim gigabytes.
      if (header)
        out.reserve(std::min<uint64_t>(header->header_bytes + header->payload_bytes, 8 * in.size() + (1 << 20)));
    }
    if (header && out.size() > header->header_bytes + header->payload_bytes) {
      throw CorruptInput(trailing_message(origin, *header, out.size() - header->header_bytes));
    }
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0) break;
      inflateReset(&zs);  // another gzip member follows
      continue;
    }
    if (rc == Z_BUF_ERROR || (zs.avail_in == 0 && zs.avail_out != 0)) {
      throw CorruptInput(
          detail::concat(origin, ": corrupt gzip data (stream truncated after ", out.size(), " decompressed bytes)"));
    }
  }
  return out;
}

}  // namespace

IdxArray parse_idx(const std::string& bytes, const std::string& origin) {
  std::optional<Header> h = parse_header(bytes, origin);
  LOCKSTEP_THROW_IF_NOT(h.has_value(), CorruptInput, origin, ": IDX file truncated in its header (", bytes.size(),
                        " bytes)");
  const uint64_t got = bytes.size() - h->header_bytes;
  LOCKSTEP_THROW_IF_NOT(got <= h->payload_bytes, CorruptInput, trailing_message(origin, *h, got));
  LOCKSTEP_THROW_IF_NOT(got == h->payload_bytes, CorruptInput, origin, ": IDX payload has ", got,
                        " bytes but dimensions ", dims_text(h->dims), " need ", h->payload_bytes, " (truncated)");
  IdxArray out;
  out.dims = std::move(h->dims);
  out.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(h->header_bytes), bytes.end());
  return out;
}

IdxArray decode_idx(const std::string& raw, const std::string& origin) {
  const bool gzip = raw.size() >= 2 && static_cast<uint8_t>(raw[0]) == 0x1f && static_cast<uint8_t>(raw[1]) == 0x8b;
  return parse_idx(gzip ? gunzip(raw, origin) : raw, origin);
}

IdxArray read_idx(const std::string& path) { return decode_idx(io::read_file(path), path); }

}  // namespace lockstep::data
