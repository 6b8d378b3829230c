// IDX reading: valid files round trip, and every kind of damage (bad magic, truncation, wrong count, bad
// labels, bad gzip) is refused with a message naming the file and the problem.
#include "runtime/data/idx.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "tests/scratch.h"
#include "tests/error_message.h"

namespace ddp {
namespace data {
namespace {

using ::ddp::testing::error_message;

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& values,
                               uint8_t type = 0x08) {
  std::vector<uint8_t> b = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
  }
  b.insert(b.end(), values.begin(), values.end());
  return b;
}

std::string write_gz(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = ddp::testing::scratch_path(name);
  gzFile f = gzopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  if (!bytes.empty()) {
    EXPECT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  gzclose(f);
  return path;
}

std::vector<uint8_t> seq(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7);
  return v;
}

TEST(Idx, ReadsValidGzipFile) {
  const std::string path = write_gz("valid-idx3.gz", idx_bytes({3, 2, 4}, seq(24)));
  const IdxArray a = read_idx_file(path);
  EXPECT_EQ(a.dims, (std::vector<uint32_t>{3, 2, 4}));
  EXPECT_EQ(a.values, seq(24));
  EXPECT_EQ(a.count(), 3);
  // An uncompressed file (as torchvision leaves beside the .gz) reads the same.
  const std::string plain = ddp::testing::scratch_path("valid-idx3");
  write_bytes(plain, idx_bytes({3, 2, 4}, seq(24)));
  EXPECT_EQ(read_idx_file(plain).values, seq(24));
}

TEST(Idx, RefusesAFifoWithinABoundNotOpened) {
  const std::string fifo = ddp::testing::scratch_path("fifo-idx3-ubyte.gz");
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string e = ddp::testing::error_message_within<InvalidArgument>(5, [&] { read_idx_file(fifo); });
  EXPECT_NE(e.find(fifo + ": it is a FIFO (named pipe), not a regular file"), std::string::npos) << e;
}

TEST(Idx, RefusesBadMagic) {
  std::vector<uint8_t> b = idx_bytes({3}, seq(3));
  b[0] = 0x1f;
  const std::string path = write_gz("badmagic.gz", b);
  const std::string e = error_message<InvalidArgument>([&] { read_idx_file(path); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("bad magic number 0x1f000801"), std::string::npos) << e;
  // A float array (type 0x0d) is not what the MNIST family uses.
  const std::string path2 = write_gz("floattype.gz", idx_bytes({3}, seq(12), 0x0d));
  EXPECT_NE(error_message<InvalidArgument>([&] { read_idx_file(path2); }).find("bad magic number 0x00000d01"),
            std::string::npos);
}

TEST(Idx, RefusesTruncatedData) {
  std::vector<uint8_t> b = idx_bytes({10, 4}, seq(40));
  b.resize(b.size() - 5);
  const std::string path = write_gz("truncated.gz", b);
  const std::string e = error_message<InvalidArgument>([&] { read_idx_file(path); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("truncated: dimensions [10,4] need 52 bytes, file has 47"), std::string::npos) << e;
  // Cut inside the header, in a file and in memory.
  const std::vector<uint8_t> header_only = {0, 0, 8, 3, 0, 0};
  EXPECT_NE(error_message<InvalidArgument>([&] { read_idx_file(write_gz("header-cut.gz", header_only)); })
                .find("truncated: the header needs 16 bytes for 3 dimensions, file has 6"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] {
              parse_idx(header_only.data(), header_only.size(), "x");
            }).find("truncated: the header"),
            std::string::npos);
}

TEST(Idx, RefusesTrailingBytesAndZeroDimension) {
  std::vector<uint8_t> b = idx_bytes({2, 2}, seq(5));
  EXPECT_NE(error_message<InvalidArgument>([&] { parse_idx(b.data(), b.size(), "f"); }).find("wrong length"),
            std::string::npos);
  // From a file the array is read into place and the rest only counted: 100000 bytes too many.
  EXPECT_NE(error_message<InvalidArgument>([&] {
              read_idx_file(write_gz("trailing.gz", idx_bytes({2, 2}, seq(100004))));
            }).find("wrong length: dimensions [2,2] need 16 bytes, file has 100016"),
            std::string::npos);
  b = idx_bytes({2, 0}, {});
  EXPECT_NE(error_message<InvalidArgument>([&] { parse_idx(b.data(), b.size(), "f"); }).find("dimension 1 is zero"),
            std::string::npos);
  b = idx_bytes({0xffffffffu, 0xffffffffu}, {});
  EXPECT_NE(error_message<InvalidArgument>([&] { parse_idx(b.data(), b.size(), "f"); }).find("the header is corrupt"),
            std::string::npos);
}

TEST(Idx, RefusesTruncatedGzipStream) {
  // Compress in memory, cut the compressed stream, write the raw bytes.
  const std::string full_path = write_gz("whole.gz", idx_bytes({100, 10}, seq(1000)));
  FILE* f = std::fopen(full_path.c_str(), "rb");
  std::vector<uint8_t> gz(4096);
  gz.resize(std::fread(gz.data(), 1, gz.size(), f));
  std::fclose(f);
  ASSERT_GT(gz.size(), 30u);
  gz.resize(gz.size() - 12);
  const std::string path = ddp::testing::scratch_path("cutgz.gz");
  f = std::fopen(path.c_str(), "wb");
  std::fwrite(gz.data(), 1, gz.size(), f);
  std::fclose(f);
  const std::string e = error_message<InvalidArgument>([&] { read_idx_file(path); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  // The in-memory path agrees.
  EXPECT_NE(error_message<InvalidArgument>([&] { gunzip(gz.data(), gz.size(), "mem"); }).find("truncated gzip"),
            std::string::npos);
}

// A well-formed single-member file takes the one-call inflate; what that path cannot take goes the streaming way:
// two gzip members one after the other (as `cat a.gz b.gz` makes) read as their concatenation, and a damaged
// stream whose trailer still states the right size is refused as corrupt, not read.
TEST(Idx, ReadsGzipOfSeveralMembersAndRefusesACorruptStream) {
  const std::vector<uint8_t> whole = idx_bytes({100, 30}, seq(3000));
  const std::vector<uint8_t> head(whole.begin(), whole.begin() + 1000), tail(whole.begin() + 1000, whole.end());
  std::vector<uint8_t> joined = file_bytes(write_gz("first-member.gz", head));
  const std::vector<uint8_t> second = file_bytes(write_gz("second-member.gz", tail));
  joined.insert(joined.end(), second.begin(), second.end());
  const std::string two = ddp::testing::scratch_path("two-members.gz");
  write_bytes(two, joined);
  EXPECT_EQ(read_idx_file(two).values, seq(3000));

  std::vector<uint8_t> damaged = file_bytes(write_gz("to-damage.gz", whole));
  ASSERT_GT(damaged.size(), 40u);
  damaged[damaged.size() / 2] ^= 0x5a;  // inside the deflate data; the trailer is intact
  const std::string bad = ddp::testing::scratch_path("damaged.gz");
  write_bytes(bad, damaged);
  const std::string e = error_message<InvalidArgument>([&] { read_idx_file(bad); });
  EXPECT_NE(e.find(bad), std::string::npos) << e;
  EXPECT_TRUE(e.find("corrupt gzip data") != std::string::npos || e.find("truncated") != std::string::npos) << e;
}

TEST(Idx, GunzipRoundTrip) {
  const std::string path = write_gz("mem.gz", idx_bytes({5}, seq(5)));
  FILE* f = std::fopen(path.c_str(), "rb");
  std::vector<uint8_t> gz(4096);
  gz.resize(std::fread(gz.data(), 1, gz.size(), f));
  std::fclose(f);
  const std::vector<uint8_t> raw = gunzip(gz.data(), gz.size(), "mem");
  EXPECT_EQ(parse_idx(raw.data(), raw.size(), "mem").values, seq(5));
  EXPECT_NE(error_message<InvalidArgument>([&] { gunzip(gz.data(), gz.size(), "mem", 10); }).find("more than 10 bytes"),
            std::string::npos);
}

TEST(Idx, MissingFileSaysWhatToDo) {
  const std::string dir = ddp::testing::scratch_path("no-such-dataset");
  const std::string e = error_message<InvalidArgument>([&] { load_fashion_mnist(dir, Split::kTrain); });
  EXPECT_NE(e.find(dir + "/train-images-idx3-ubyte.gz"), std::string::npos) << e;
  EXPECT_NE(e.find("apt-get install dataset-fashion-mnist"), std::string::npos) << e;
  EXPECT_NE(e.find("or name a directory with the four Fashion-MNIST .gz files"), std::string::npos) << e;
}

// A miniature Fashion-MNIST directory written by the test: normalisation, counts and label checks.
class MiniDataset : public ::testing::Test {
 protected:
  std::string dir_ = ddp::testing::scratch_dir("mini-fmnist");
  void write(Split split, uint32_t n_images, uint32_t n_labels, uint8_t max_label = 9) {
    std::vector<uint8_t> pixels(n_images * 784);
    for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i % 256);
    std::vector<uint8_t> labels(n_labels);
    for (uint32_t i = 0; i < n_labels; ++i) labels[i] = static_cast<uint8_t>(i % (max_label + 1));
    write_gz("mini-fmnist/" + fashion_mnist_images_file(split), idx_bytes({n_images, 28, 28}, pixels));
    write_gz("mini-fmnist/" + fashion_mnist_labels_file(split), idx_bytes({n_labels}, labels));
  }
};

TEST_F(MiniDataset, LoadsAndNormalises) {
  write(Split::kTest, 4, 4);
  const Dataset d = load_fashion_mnist(dir_, Split::kTest);
  EXPECT_EQ(d.size, 4);
  EXPECT_EQ(d.feature_count, 784);
  ASSERT_EQ(d.features.size(), 4u * 784u);
  EXPECT_FLOAT_EQ(d.features[0], (0.0f - 0.2860f) / 0.3530f);
  EXPECT_FLOAT_EQ(d.features[255], (1.0f - 0.2860f) / 0.3530f);
  EXPECT_EQ(d.labels, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST_F(MiniDataset, RefusesCountMismatch) {
  write(Split::kTrain, 4, 5);
  const std::string e = error_message<InvalidArgument>([&] { load_fashion_mnist(dir_, Split::kTrain); });
  EXPECT_NE(e.find("4 images but 5 labels"), std::string::npos) << e;
  EXPECT_NE(e.find("train-labels-idx1-ubyte.gz"), std::string::npos) << e;
}

TEST_F(MiniDataset, RefusesLabelOutOfRange) {
  write(Split::kTrain, 12, 12, 11);
  const std::string e = error_message<InvalidArgument>([&] { load_fashion_mnist(dir_, Split::kTrain); });
  EXPECT_NE(e.find("label 10 of sample 10 is outside [0, 10)"), std::string::npos) << e;
}

TEST(FashionMnist, ReadsTheInstalledDataset) {
  struct stat info;
  if (::stat(kDefaultFashionMnistDir, &info) != 0) {
    GTEST_SKIP() << kDefaultFashionMnistDir << " is missing: apt-get install dataset-fashion-mnist";
  }
  const Dataset train = load_fashion_mnist(kDefaultFashionMnistDir, Split::kTrain);
  const Dataset test = load_fashion_mnist(kDefaultFashionMnistDir, Split::kTest);
  EXPECT_EQ(train.size, 60000);
  EXPECT_EQ(test.size, 10000);
  EXPECT_EQ(train.feature_count, 784);
  // The normalisation constants are the training set's own mean and standard deviation.
  double sum = 0, sq = 0;
  for (float x : train.features) {
    const double pixel = x * 0.3530 + 0.2860;
    sum += pixel;
    sq += pixel * pixel;
  }
  const double n = static_cast<double>(train.features.size());
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0.2860, 5e-4);
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 0.3530, 5e-4);
  std::vector<int> per_class(10);
  for (int32_t l : train.labels) ++per_class[l];
  for (int c : per_class) EXPECT_EQ(c, 6000);
}

}  // namespace
}  // namespace data
}  // namespace ddp
