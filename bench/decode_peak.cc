// decode_peak: the peak memory of decoding (and applying) one KV-event
// payload of each worst shape, as a multiple of the payload's size. The
// decoder refuses a payload once its batch would hold more than
// kDecodePeakPerPayloadByte (index/decode_budget.h) per payload byte; this
// table shows what each shape costs, refused or not.
//
// Each shape is packed with msgpack-cxx to just under --payload_mib, then,
// in a child process of its own, its peak resident memory is reset
// (/proc/self/clear_refs, 5) and DecodeEventBatch + FleetIndex::Apply of
// the payload run once; the growth of VmHWM over VmRSS before is the peak.
//
//   decode_peak [--payload_mib=16]
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "index/events.h"
#include "index/fleet_index.h"
#include "index/msgpack_view.h"

ABSL_FLAG(int, payload_mib, 16, "size of each payload, MiB");

namespace prefixd {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

// Field `name` of /proc/self/status, KiB.
int64_t StatusKib(const std::string& name) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(name + ":", 0) != 0) continue;
    int64_t v = 0;
    std::string digits;
    for (char c : line)
      if (c >= '0' && c <= '9') digits += c;
    if (absl::SimpleAtoi(digits, &v)) return v;
  }
  return -1;
}

struct Shape {
  const char* name;
  // Packs the events array's elements that fit in `bytes`.
  std::function<void(Packer&, size_t bytes)> events;
};

// [ts, [events...], nil]
std::string Batch(const Shape& shape, size_t bytes) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_array(3);
  pk.pack_double(1.7e9);
  shape.events(pk, bytes - 32);
  pk.pack_nil();
  return std::string(buf.data(), buf.size());
}

// One BlockStored of `blocks` blocks of `block_size` tokens (hash and
// token 1 each: one byte apiece), in group 1.
void Stored(Packer& pk, size_t blocks, size_t block_size) {
  pk.pack_array(1);
  pk.pack_array(9);
  pk.pack(std::string("BlockStored"));
  pk.pack_array(static_cast<uint32_t>(blocks));
  for (size_t i = 0; i < blocks; ++i) pk.pack(1);
  pk.pack_nil();
  pk.pack_array(static_cast<uint32_t>(blocks * block_size));
  for (size_t i = 0; i < blocks * block_size; ++i) pk.pack(1);
  pk.pack(static_cast<uint64_t>(block_size));
  pk.pack_nil();
  pk.pack(std::string("GPU"));
  pk.pack_nil();
  pk.pack_nil();
}

// The events array of as many copies of one event, `event_bytes` long
// packed, as fit in `bytes`.
void Repeated(Packer& pk, size_t bytes, size_t event_bytes,
              const std::function<void(Packer&)>& event) {
  const size_t n = bytes / event_bytes;
  pk.pack_array(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) event(pk);
}

const std::vector<Shape>& Shapes() {
  static const auto* shapes = new std::vector<Shape>{
      {"BlockStored, 1 block of all the tokens",
       [](Packer& pk, size_t bytes) { Stored(pk, 1, bytes - 64); }},
      {"BlockStored, blocks of 16 tokens",
       [](Packer& pk, size_t bytes) { Stored(pk, (bytes - 64) / 17, 16); }},
      {"BlockStored, blocks of 1 token",
       [](Packer& pk, size_t bytes) { Stored(pk, (bytes - 64) / 2, 1); }},
      {"BlockRemoved, hashes of 1 byte",
       [](Packer& pk, size_t bytes) {
         const size_t n = bytes - 64;
         pk.pack_array(1);
         pk.pack_array(2);
         pk.pack(std::string("BlockRemoved"));
         pk.pack_array(static_cast<uint32_t>(n));
         for (size_t i = 0; i < n; ++i) pk.pack(1);
       }},
      {"AllBlocksCleared events",
       [](Packer& pk, size_t bytes) {
         Repeated(pk, bytes, 18, [](Packer& e) {  // ["AllBlocksCleared"]
           e.pack_array(1);
           e.pack(std::string("AllBlocksCleared"));
         });
       }},
      {"removed events, one 1-byte hash each",
       [](Packer& pk, size_t bytes) {
         Repeated(pk, bytes, 11, [](Packer& e) {  // ["removed", [1]]
           e.pack_array(2);
           e.pack(std::string("removed"));
           e.pack_array(1);
           e.pack(1);
         });
       }},
      {"stored events, one 1-token block each",
       [](Packer& pk, size_t bytes) {
         // ["stored", [1], nil, [1], 1]
         Repeated(pk, bytes, 14, [](Packer& e) {
           e.pack_array(5);
           e.pack(std::string("stored"));
           e.pack_array(1);
           e.pack(1);
           e.pack_nil();
           e.pack_array(1);
           e.pack(1);
           e.pack(1);
         });
       }},
      {"cleared events (9 bytes each)",
       [](Packer& pk, size_t bytes) {
         Repeated(pk, bytes, 9, [](Packer& e) {  // ["cleared"]
           e.pack_array(1);
           e.pack(std::string("cleared"));
         });
       }},
      {"unknown trailing fields (nil)",
       [](Packer& pk, size_t bytes) {
         const size_t n = bytes - 64;
         pk.pack_array(1);
         pk.pack_array(static_cast<uint32_t>(n + 1));
         pk.pack(std::string("AllBlocksCleared"));
         for (size_t i = 0; i < n; ++i) pk.pack_nil();
       }},
      {"extra_keys, 32 empty arrays a block",
       [](Packer& pk, size_t bytes) {
         // A block: its hash, its token and 32 one-byte items (37 bytes).
         const size_t blocks = (bytes - 64) / 37;
         pk.pack_array(1);
         pk.pack_array(9);
         pk.pack(std::string("BlockStored"));
         pk.pack_array(static_cast<uint32_t>(blocks));
         for (size_t i = 0; i < blocks; ++i) pk.pack(1);
         pk.pack_nil();
         pk.pack_array(static_cast<uint32_t>(blocks));
         for (size_t i = 0; i < blocks; ++i) pk.pack(1);
         pk.pack(1);
         pk.pack_nil();
         pk.pack(std::string("GPU"));
         pk.pack_nil();
         pk.pack_array(static_cast<uint32_t>(blocks));
         for (size_t i = 0; i < blocks; ++i) {
           pk.pack_array(32);
           for (int k = 0; k < 32; ++k) pk.pack_array(0);
         }
       }},
      {"extra_keys, 32 empty arrays, no tokens",
       [](Packer& pk, size_t bytes) {
         // A block: its hash and 32 one-byte items (36 bytes); a store of
         // hashes alone (token_ids nil).
         const size_t blocks = (bytes - 64) / 36;
         pk.pack_array(1);
         pk.pack_array(9);
         pk.pack(std::string("BlockStored"));
         pk.pack_array(static_cast<uint32_t>(blocks));
         for (size_t i = 0; i < blocks; ++i) pk.pack(1);
         for (int i = 0; i < 3; ++i) pk.pack_nil();  // parent, tokens, size
         pk.pack_nil();
         pk.pack(std::string("GPU"));
         pk.pack_nil();
         pk.pack_array(static_cast<uint32_t>(blocks));
         for (size_t i = 0; i < blocks; ++i) {
           pk.pack_array(32);
           for (int k = 0; k < 32; ++k) pk.pack_array(0);
         }
       }},
      {"extra_keys, one entry of empty arrays",
       [](Packer& pk, size_t bytes) {
         const size_t n = bytes - 96;
         pk.pack_array(1);
         pk.pack_array(9);
         pk.pack(std::string("BlockStored"));
         pk.pack_array(1);
         pk.pack(1);
         pk.pack_nil();
         pk.pack_array(16);
         for (int i = 0; i < 16; ++i) pk.pack(1);
         pk.pack(16);
         pk.pack_nil();
         pk.pack(std::string("GPU"));
         pk.pack_nil();
         pk.pack_array(1);  // extra_keys: one block's list
         pk.pack_array(static_cast<uint32_t>(n));
         for (size_t i = 0; i < n; ++i) pk.pack_array(0);
       }},
  };
  return *shapes;
}

// In a child: the peak growth of resident memory while `payload` is
// decoded and applied (KiB; -1 if the child failed), and whether it
// decoded.
struct Peak {
  int64_t kib = -1;
  int64_t decoded = 0;
};

Peak Measure(const std::string& payload) {
  int fds[2];
  if (pipe(fds) != 0) return Peak();
  const pid_t pid = fork();
  if (pid == 0) {
    FleetIndex index(IndexOptions{});
    const WorkerId w = index.AddWorker("w", "tcp://127.0.0.1:1");
    KvEventBatch batch;
    std::ofstream("/proc/self/clear_refs") << "5";
    const int64_t before = StatusKib("VmRSS");
    const absl::Status s = DecodeEventBatch(payload, &batch);
    if (s.ok()) index.Apply(w, batch, 0, absl::Now());
    const Peak peak{StatusKib("VmHWM") - before, s.ok() ? 1 : 0};
    if (!s.ok()) std::fprintf(stderr, "  %s\n", s.ToString().c_str());
    if (write(fds[1], &peak, sizeof(peak)) != sizeof(peak)) _exit(1);
    _exit(0);
  }
  close(fds[1]);
  Peak peak;
  if (read(fds[0], &peak, sizeof(peak)) != sizeof(peak)) peak = Peak();
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return peak;
}

}  // namespace
}  // namespace prefixd

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_payload_mib))
                       << 20;
  for (const prefixd::Shape& shape : prefixd::Shapes()) {
    const std::string payload = prefixd::Batch(shape, bytes);
    const prefixd::Peak peak = prefixd::Measure(payload);
    std::printf("%-38s %9zu B payload  peak +%7lld KiB  %5.1fx  %s\n",
                shape.name, payload.size(), static_cast<long long>(peak.kib),
                peak.kib * 1024.0 / static_cast<double>(payload.size()),
                peak.kib < 0   ? "failed"
                : peak.decoded ? "decoded"
                               : "refused");
    std::fflush(stdout);
  }
  return 0;
}
