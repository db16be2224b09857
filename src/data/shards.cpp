// Tar shards through libarchive: one scan of the headers at open (counts, image members, labels), then per epoch a
// background reader per rank that walks its run of the shuffled shard sequence and hands the image bytes over.
#include "data/shards.h"

#include <archive.h>
#include <archive_entry.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "util/fs.h"

namespace vit {
namespace stdfs = std::filesystem;
namespace {

constexpr uint64_t kShardOrderSalt = 0x7368617264ull;     // "shard"
constexpr uint64_t kShuffleBufferSalt = 0x627566666572ull;  // "buffer"

bool is_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string trim(const std::string& text) {
  size_t first = 0, last = text.size();
  while (first < last && std::isspace(static_cast<unsigned char>(text[first]))) ++first;
  while (last > first && std::isspace(static_cast<unsigned char>(text[last - 1]))) --last;
  return text.substr(first, last - first);
}

// ---- reading a tar through libarchive ----

// One member of a tar as the walk sees it: its name split webdataset's way ("dir/key.ext.more" -> key "dir/key",
// extension "ext.more", lowercased).
struct Member {
  std::string name, key, extension;
  int64_t offset = 0;  // of its header in the (uncompressed) tar
};

// Sequential reader of one shard: members in order, each read or skipped once.
class TarReader {
 public:
  explicit TarReader(std::string path) : path_(std::move(path)), archive_(archive_read_new()) {
    if (!archive_) throw std::runtime_error(path_ + ": cannot allocate a tar reader");
    archive_read_support_format_tar(archive_);
    archive_read_support_filter_all(archive_);  // .tar.gz and friends stream too
    if (archive_read_open_filename(archive_, path_.c_str(), 1 << 16) != ARCHIVE_OK) fail("cannot open as a tar");
  }
  ~TarReader() { archive_read_free(archive_); }
  TarReader(const TarReader&) = delete;
  TarReader& operator=(const TarReader&) = delete;

  // The next regular file; false at the end of the archive.
  bool next(Member& member) {
    for (;;) {
      archive_entry* entry = nullptr;
      const int status = archive_read_next_header(archive_, &entry);
      if (status == ARCHIVE_EOF) return false;
      if (status < ARCHIVE_WARN) fail("cannot read the member header");
      if (archive_entry_filetype(entry) != AE_IFREG) continue;
      const char* name = archive_entry_pathname(entry);
      member.name = name ? name : "";
      member.offset = archive_read_header_position(archive_);
      const size_t slash = member.name.rfind('/');
      const size_t dot = member.name.find('.', slash == std::string::npos ? 0 : slash + 1);
      if (dot == std::string::npos) {
        member.key = member.name;
        member.extension.clear();
      } else {
        member.key = member.name.substr(0, dot);
        member.extension = member.name.substr(dot + 1);
        for (char& c : member.extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      }
      current_ = member.name;
      return true;
    }
  }

  // The current member's data.
  std::string read() {
    std::string bytes;
    char buffer[1 << 16];
    for (;;) {
      const la_ssize_t count = archive_read_data(archive_, buffer, sizeof buffer);
      if (count < 0) fail("cannot read member \"" + current_ + "\"");
      if (count == 0) return bytes;
      bytes.append(buffer, static_cast<size_t>(count));
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    const char* reason = archive_error_string(archive_);
    const std::string last = current_.empty() ? std::string() : ", after member \"" + current_ + "\"";
    throw std::runtime_error(path_ + ": " + what + " at byte offset " +
                             std::to_string(archive_filter_bytes(archive_, -1)) + last + ": " +
                             (reason ? reason : "unknown libarchive error") + " (truncated or not a tar?)");
  }

 private:
  std::string path_;
  archive* archive_;
  std::string current_;
};

bool is_image_extension(const std::string& extension) {
  return extension == "jpg" || extension == "jpeg" || extension == "png" || extension == "webp";
}

// Walks a shard's samples (runs of consecutive members with one key). For every member, visit(sample number,
// member, reader) may read its data; what it leaves is skipped. visit returns false to stop the walk.
void walk_samples(TarReader& tar,
                  const std::function<bool(int64_t sample, const Member& member, TarReader& reader)>& visit) {
  Member member;
  std::string key;
  int64_t sample = -1;
  while (tar.next(member)) {
    if (sample < 0 || member.key != key) {
      ++sample;
      key = member.key;
    }
    if (!visit(sample, member, tar)) return;
  }
}

// ---- the index a scan builds ----

struct ShardIndex {
  std::vector<std::string> shards;
  std::vector<int64_t> first;           // (shards + 1) global index of each shard's first sample; first.back() = N
  std::vector<std::string> keys;        // (N)
  std::vector<std::string> image_names; // (N) the image member of each sample
  std::vector<int64_t> labels;          // (N)
  std::vector<std::string> classes;

  int64_t size() const { return first.back(); }
  int64_t shard_of(int64_t index) const {
    return std::upper_bound(first.begin(), first.end(), index) - first.begin() - 1;
  }
};

int64_t parse_label(const std::string& text, const std::string& extension, const std::string& field,
                    const std::string& where) {
  if (extension == "cls") {
    const std::string value = trim(text);
    if (!is_digits(value) || value.size() > 9) {
      throw std::runtime_error(where + ".cls: \"" + value.substr(0, 40) + "\" is not a non-negative integer label");
    }
    return std::stoll(value);
  }
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw std::runtime_error(where + ".json: not JSON (" + error.what() + ")");
  }
  if (!doc.is_object() || !doc.contains(field)) {
    throw std::runtime_error(where + ".json: no field \"" + field + "\" (set data.label_field)");
  }
  const nlohmann::json& value = doc[field];
  if (!value.is_number_integer() || value.get<int64_t>() < 0) {
    throw std::runtime_error(where + ".json: field \"" + field + "\" is " + value.dump() +
                             ", not a non-negative integer label");
  }
  return value.get<int64_t>();
}

// One pass over a shard's headers: keys, image members and labels of its samples, appended to `index`.
void scan_shard(const std::string& path, const ShardOptions& options, ShardIndex& index) {
  if (!stdfs::is_regular_file(path)) throw std::runtime_error(path + ": shard not found");
  TarReader tar(path);
  struct Pending {
    std::string key, image;
    int64_t label = -1;
    bool from_cls = false;
  };
  std::vector<Pending> samples;
  walk_samples(tar, [&](int64_t sample, const Member& member, TarReader& reader) {
    if (sample == static_cast<int64_t>(samples.size())) samples.push_back({member.key, "", -1, false});
    Pending& pending = samples.back();
    const std::string where = path + ": sample \"" + member.key + "\"";
    if (is_image_extension(member.extension)) {
      if (pending.image.empty()) pending.image = member.name;
    } else if (member.extension == "cls" || (member.extension == "json" && !pending.from_cls)) {
      pending.label = parse_label(reader.read(), member.extension, options.label_field, where);
      pending.from_cls = member.extension == "cls";
    }
    return true;
  });
  for (const Pending& sample : samples) {
    const std::string where = path + ": sample \"" + sample.key + "\"";
    if (sample.image.empty()) throw std::runtime_error(where + " has no image member (.jpg .jpeg .png .webp)");
    if (sample.label < 0) {
      throw std::runtime_error(where + " has no label (a .cls member, or .json with field \"" + options.label_field +
                               "\")");
    }
    index.keys.push_back(sample.key);
    index.image_names.push_back(sample.image);
    index.labels.push_back(sample.label);
  }
  index.first.push_back(static_cast<int64_t>(index.keys.size()));
}

// ---- one rank's stream ----

// A run of consecutive samples of one shard: local sample numbers [begin, end).
struct Piece {
  int64_t shard = 0, begin = 0, end = 0;
};

// Rank `rank`'s contiguous run of the epoch's shard sequence (N/W samples, the first N mod W ranks one more).
std::vector<Piece> rank_pieces(const ShardIndex& index, const std::vector<int64_t>& shard_order, int64_t rank,
                               int64_t world_size) {
  const int64_t N = index.size(), q = N / world_size, extra = N % world_size;
  const int64_t run_begin = rank * q + std::min(rank, extra);
  const int64_t run_end = run_begin + q + (rank < extra ? 1 : 0);
  std::vector<Piece> pieces;
  int64_t position = 0;  // of the shard's first sample in the epoch's sequence
  for (const int64_t shard : shard_order) {
    const int64_t count = index.first[shard + 1] - index.first[shard];
    const int64_t begin = std::max(run_begin, position), end = std::min(run_end, position + count);
    if (begin < end) pieces.push_back({shard, begin - position, end - position});
    position += count;
  }
  return pieces;
}

class ShardStream final : public SampleStream {
 public:
  ShardStream(std::shared_ptr<const ShardIndex> index, std::shared_ptr<const ImageCodec> codec,
              std::vector<Piece> pieces, const std::vector<int64_t>& wanted, int64_t capacity)
      : index_(std::move(index)), codec_(std::move(codec)), pieces_(std::move(pieces)),
        capacity_(std::max<int64_t>(capacity, 1)) {
    wanted_.insert(wanted.begin(), wanted.end());
    reader_ = std::thread([this] { read_all(); });
  }
  ~ShardStream() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    space_.notify_all();
    reader_.join();
  }

  InputSample take(int64_t index) override {
    std::unique_lock<std::mutex> lock(mutex_);
    arrived_.wait(lock, [&] { return store_.count(index) > 0 || error_ || done_; });
    const auto it = store_.find(index);
    if (it == store_.end()) {
      if (error_) std::rethrow_exception(error_);
      throw std::logic_error("sample " + std::to_string(index) + " is not in this rank's part of the epoch");
    }
    InputSample sample = std::move(it->second);
    store_.erase(it);
    space_.notify_all();
    return sample;
  }

 private:
  void read_all() {
    try {
      for (const Piece& piece : pieces_) {
        const std::string& path = index_->shards[piece.shard];
        const int64_t first = index_->first[piece.shard];
        TarReader tar(path);
        int64_t seen = 0;  // samples of the shard walked so far
        walk_samples(tar, [&](int64_t sample, const Member& member, TarReader& reader) {
          seen = sample + 1;
          if (sample >= piece.end) return false;
          const int64_t i = first + sample;
          if (sample < piece.begin || member.name != index_->image_names[i]) return true;
          if (wanted_.erase(i) == 0) return true;
          InputSample out{ImageInput(reader.read(), path + "#" + member.name, codec_), index_->labels[i]};
          std::unique_lock<std::mutex> lock(mutex_);
          space_.wait(lock, [&] { return stop_ || static_cast<int64_t>(store_.size()) < capacity_; });
          if (stop_) return false;
          store_.emplace(i, std::move(out));
          arrived_.notify_all();
          return true;
        });
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (stop_) return;
        }
        if (seen < piece.end) {
          throw std::runtime_error(path + ": ends after " + std::to_string(seen) + " samples, but had " +
                                   std::to_string(index_->first[piece.shard + 1] - first) +
                                   " when the dataset was opened (changed since?)");
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    arrived_.notify_all();
  }

  std::shared_ptr<const ShardIndex> index_;
  std::shared_ptr<const ImageCodec> codec_;
  std::vector<Piece> pieces_;
  int64_t capacity_;
  std::unordered_set<int64_t> wanted_;  // reader thread only: samples still to read
  std::thread reader_;

  std::mutex mutex_;
  std::condition_variable arrived_, space_;
  std::unordered_map<int64_t, InputSample> store_;  // read, not yet taken
  std::exception_ptr error_;
  bool done_ = false, stop_ = false;
};

// ---- the dataset ----

class ShardDataset final : public StreamDataset {
 public:
  ShardDataset(std::shared_ptr<const ShardIndex> index, std::shared_ptr<const ImageCodec> codec, int64_t buffer)
      : index_(std::move(index)), codec_(std::move(codec)), buffer_(buffer) {}

  int64_t size() const override { return index_->size(); }
  Sample get(int64_t index) const override {
    InputSample sample = get_input(index);
    return {std::move(sample.input).decode(), sample.label};
  }
  // Random access walks the shard's headers up to the sample: fine for a tool or a test, not for training.
  InputSample get_input(int64_t index) const override {
    check_index(index);
    const int64_t shard = index_->shard_of(index);
    const std::string& path = index_->shards[shard];
    const int64_t local = index - index_->first[shard];
    TarReader tar(path);
    std::string bytes;
    bool found = false;
    walk_samples(tar, [&](int64_t sample, const Member& member, TarReader& reader) {
      if (sample == local && member.name == index_->image_names[index]) {
        bytes = reader.read();
        found = true;
      }
      return !found && sample <= local;
    });
    if (!found) throw std::runtime_error(path + ": sample \"" + index_->keys[index] + "\" is gone (shard changed?)");
    return {ImageInput(std::move(bytes), path + "#" + index_->image_names[index], codec_), index_->labels[index]};
  }
  std::string source(int64_t index) const override {
    check_index(index);
    return index_->shards[index_->shard_of(index)] + "#" + index_->image_names[index];
  }
  int64_t label(int64_t index) const override {
    check_index(index);
    return index_->labels[index];
  }
  const std::vector<std::string>& class_names() const override { return index_->classes; }

  std::vector<int64_t> epoch_order(const EpochLayout& layout) const override {
    const int64_t N = size(), B = layout.batch_size, W = layout.world_size;
    const std::vector<int64_t> shards = shard_order(layout);
    std::vector<int64_t> order(N, -1);
    const int64_t full = N / (B * W);
    for (int64_t r = 0; r < W; ++r) {
      std::vector<int64_t> arrivals;
      for (const Piece& piece : rank_pieces(*index_, shards, r, W)) {
        for (int64_t s = piece.begin; s < piece.end; ++s) arrivals.push_back(index_->first[piece.shard] + s);
      }
      const std::vector<int64_t> emitted =
          layout.shuffle ? shuffle_buffer_order(arrivals, buffer_,
                                                mix_seed({layout.seed, static_cast<uint64_t>(layout.epoch),
                                                          static_cast<uint64_t>(r), kShuffleBufferSalt}))
                         : arrivals;
      // Rank r's j-th sample is row j - k*B of its batch k (the tail batch k = full takes the rest).
      for (int64_t j = 0; j < static_cast<int64_t>(emitted.size()); ++j) {
        const int64_t k = std::min(j / B, full);
        order[batch_positions(N, B, W, r, k).first + j - k * B] = emitted[j];
      }
    }
    return order;
  }

  std::unique_ptr<SampleStream> open_stream(const EpochLayout& layout, int64_t rank,
                                            const std::vector<int64_t>& wanted, int64_t capacity) const override {
    return std::make_unique<ShardStream>(index_, codec_, rank_pieces(*index_, shard_order(layout), rank,
                                                                     layout.world_size),
                                         wanted, capacity + buffer_);
  }

 private:
  std::vector<int64_t> shard_order(const EpochLayout& layout) const {
    const auto count = static_cast<int64_t>(index_->shards.size());
    if (layout.shuffle) {
      return seeded_permutation(count, mix_seed({layout.seed, static_cast<uint64_t>(layout.epoch), kShardOrderSalt}));
    }
    std::vector<int64_t> order(count);
    std::iota(order.begin(), order.end(), 0);
    return order;
  }
  void check_index(int64_t index) const {
    if (index < 0 || index >= size()) {
      throw std::out_of_range("sample index " + std::to_string(index) + " out of range for " +
                              std::to_string(size()) + " samples in " + std::to_string(index_->shards.size()) +
                              " shards");
    }
  }

  std::shared_ptr<const ShardIndex> index_;
  std::shared_ptr<const ImageCodec> codec_;
  int64_t buffer_;
};

}  // namespace

std::vector<std::string> expand_braces(const std::string& pattern) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) return {pattern};
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos) throw std::invalid_argument("\"" + pattern + "\": '{' without a closing '}'");
  const std::string head = pattern.substr(0, open), body = pattern.substr(open + 1, close - open - 1);
  std::vector<std::string> choices;
  const size_t dots = body.find("..");
  if (dots != std::string::npos && is_digits(body.substr(0, dots)) && is_digits(body.substr(dots + 2))) {
    const std::string low = body.substr(0, dots), high = body.substr(dots + 2);
    if (low.size() > 18 || high.size() > 18) throw std::invalid_argument("\"" + pattern + "\": range too large");
    const bool padded = (low.size() > 1 && low[0] == '0') || (high.size() > 1 && high[0] == '0');
    const size_t width = padded ? std::max(low.size(), high.size()) : 0;
    const int64_t from = std::stoll(low), to = std::stoll(high);
    if (std::abs(to - from) > 10'000'000) throw std::invalid_argument("\"" + pattern + "\": range too large");
    for (int64_t i = from;; i += from <= to ? 1 : -1) {
      std::string number = std::to_string(i);
      if (number.size() < width) number.insert(0, width - number.size(), '0');
      choices.push_back(number);
      if (i == to) break;
    }
  } else {
    size_t start = 0;
    for (;;) {
      const size_t comma = body.find(',', start);
      choices.push_back(body.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  }
  std::vector<std::string> out;
  const std::vector<std::string> tails = expand_braces(pattern.substr(close + 1));
  for (const std::string& choice : choices) {
    for (const std::string& tail : tails) out.push_back(head + choice + tail);
  }
  return out;
}

std::vector<std::string> expand_shard_spec(const std::string& spec) {
  std::vector<std::string> shards;
  const auto add_pattern = [&](const std::string& pattern, const stdfs::path& base) {
    for (const std::string& shard : expand_braces(pattern)) {
      const stdfs::path path(shard);
      shards.push_back(path.is_relative() && !base.empty() ? (base / path).lexically_normal().string() : shard);
    }
  };
  const std::string extension = lower_extension(spec);
  const bool listing = spec.find('{') == std::string::npos && spec.find("::") == std::string::npos &&
                       extension != ".tar" && extension != ".tgz" && extension != ".gz" && stdfs::is_regular_file(spec);
  if (listing) {
    const std::string text = read_file(spec);
    const stdfs::path base = stdfs::path(spec).parent_path();
    size_t start = 0;
    while (start < text.size()) {
      size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      const std::string line = trim(text.substr(start, end - start));
      if (!line.empty() && line[0] != '#') add_pattern(line, base);
      start = end + 1;
    }
    if (shards.empty()) throw std::runtime_error(spec + ": the shard list names no shards");
    return shards;
  }
  size_t start = 0;
  for (;;) {
    const size_t separator = spec.find("::", start);
    const std::string part = spec.substr(start, separator == std::string::npos ? std::string::npos : separator - start);
    if (!part.empty()) add_pattern(part, {});
    if (separator == std::string::npos) break;
    start = separator + 2;
  }
  if (shards.empty()) throw std::invalid_argument("shard spec \"" + spec + "\" names no shards");
  return shards;
}

std::vector<int64_t> shuffle_buffer_order(const std::vector<int64_t>& arrivals, int64_t buffer, uint64_t seed) {
  if (buffer <= 1) return arrivals;
  std::mt19937_64 rng(seed);
  std::vector<int64_t> held, out;
  held.reserve(static_cast<size_t>(std::min<int64_t>(buffer, static_cast<int64_t>(arrivals.size()))));
  out.reserve(arrivals.size());
  for (const int64_t sample : arrivals) {
    if (static_cast<int64_t>(held.size()) < buffer) {
      held.push_back(sample);
      continue;
    }
    int64_t& slot = held[uniform_int(rng, buffer)];
    out.push_back(slot);
    slot = sample;
  }
  while (!held.empty()) {
    int64_t& slot = held[uniform_int(rng, static_cast<int64_t>(held.size()))];
    out.push_back(slot);
    slot = held.back();
    held.pop_back();
  }
  return out;
}

std::shared_ptr<const StreamDataset> open_shards(const std::string& spec, const ShardOptions& options,
                                                 std::shared_ptr<const ImageCodec> codec, const Dataset* train) {
  auto index = std::make_shared<ShardIndex>();
  index->shards = expand_shard_spec(spec);
  index->first.push_back(0);
  for (const std::string& shard : index->shards) scan_shard(shard, options, *index);
  if (index->size() == 0) throw std::runtime_error(spec + ": the shards hold no samples");
  if (train) {
    index->classes = train->class_names();
    const auto count = static_cast<int64_t>(index->classes.size());
    for (int64_t i = 0; i < index->size(); ++i) {
      if (index->labels[i] >= count) {
        throw std::runtime_error(index->shards[index->shard_of(i)] + ": sample \"" + index->keys[i] + "\" has label " +
                                 std::to_string(index->labels[i]) + ", but the training shards have " +
                                 std::to_string(count) + " classes");
      }
    }
  } else {
    index->classes = numbered_classes(*std::max_element(index->labels.begin(), index->labels.end()) + 1);
  }
  return std::make_shared<ShardDataset>(std::move(index), std::move(codec), options.shuffle_buffer);
}

}  // namespace vit
