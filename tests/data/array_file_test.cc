// A user's own data from .npy and safetensors files: arrays round-trip, data sets of class labels and of float
// targets of any width are built from them, and every file that is not what it claims is refused with its name,
// the array and what was expected. Float targets then travel the whole data path: the loader's batches,
// to_device, the resident data set's gathers and the evaluation shard's chunks.
#include "runtime/data/array_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <string>

#include "runtime/core/check.h"
#include "runtime/data/evaluation_shard.h"
#include "runtime/data/loader.h"
#include "runtime/data/resident_dataset.h"
#include "runtime/io/safetensors.h"
#include "tests/scratch.h"
#include "tests/error_message.h"

namespace ddp {
namespace data {
namespace {

using ::ddp::testing::error_message;

template <typename T>
HostArray array_of(DType dtype, std::vector<int64_t> shape, const std::vector<T>& values) {
  HostArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.bytes.resize(values.size() * sizeof(T));
  std::memcpy(a.bytes.data(), values.data(), a.bytes.size());
  return a;
}

void write_bytes(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

TEST(Npy, WrittenArraysReadBackWithTheirDtypeShapeAndBytes) {
  const std::string dir = ddp::testing::fresh_scratch_dir("npy_round_trip");
  const HostArray f = array_of<float>(DType::kFloat32, {2, 3}, {1, 2, 3, 4, 5, 6.5f});
  const HostArray i = array_of<int64_t>(DType::kInt64, {4}, {0, 3, 1, 2});
  write_npy(dir + "/f.npy", f);
  write_npy(dir + "/i.npy", i);
  for (const auto& [path, a] : {std::pair{dir + "/f.npy", f}, std::pair{dir + "/i.npy", i}}) {
    const HostArray back = read_npy(path);
    EXPECT_EQ(back.dtype, a.dtype);
    EXPECT_EQ(back.shape, a.shape);
    EXPECT_EQ(back.bytes, a.bytes);
  }
}

TEST(Npy, NotWhatItClaimsIsRefusedWithTheFileAndTheReason) {
  const std::string dir = ddp::testing::fresh_scratch_dir("npy_bad");
  write_npy(dir + "/good.npy", array_of<float>(DType::kFloat32, {2, 2}, {1, 2, 3, 4}));
  std::string good;
  {
    std::ifstream in(dir + "/good.npy", std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  write_bytes(dir + "/magic.npy", "PK\x03\x04 not numpy at all");
  EXPECT_NE(
      error_message<InvalidArgument>([&] { read_npy(dir + "/magic.npy"); }).find("magic.npy: not a NumPy .npy file"),
      std::string::npos);
  write_bytes(dir + "/truncated.npy", good.substr(0, good.size() - 3));
  EXPECT_NE(error_message<InvalidArgument>([&] { read_npy(dir + "/truncated.npy"); }).find("(truncated)"),
            std::string::npos);
  std::string big_endian = good;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  write_bytes(dir + "/be.npy", big_endian);
  EXPECT_NE(error_message<InvalidArgument>([&] { read_npy(dir + "/be.npy"); }).find("dtype '>f4' is not read"),
            std::string::npos);
  std::string fortran = good;
  fortran.replace(fortran.find("False"), 5, "True ");
  write_bytes(dir + "/fortran.npy", fortran);
  EXPECT_NE(error_message<InvalidArgument>([&] { read_npy(dir + "/fortran.npy"); }).find("Fortran-ordered"),
            std::string::npos);
}

// A version 1.0 .npy file of 2 float32 values 1 and 2 whose header dictionary is `dict`.
std::string npy_with_header(const std::string& dict) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out = std::string("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  const float values[2] = {1, 2};
  out.append(reinterpret_cast<const char*>(values), sizeof values);
  return out;
}

std::string npy_header_error(const std::string& dict) {
  const std::string bytes = npy_with_header(dict);
  return error_message<InvalidArgument>(
      [&] { parse_npy(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x.npy"); });
}

// numpy.load reads the header with ast.literal_eval and wants exactly the keys descr, fortran_order and shape.
TEST(Npy, TheHeaderIsReadAsNumpyReadsItAndAnythingElseIsRefused) {
  for (const char* good : {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }",
                           "{\"shape\": (2,), \"descr\": \"<f4\", \"fortran_order\": False}",
                           "{'descr':'<f4','fortran_order':False,'shape':(1, 2)}", "{'descr': '<f4', "
                           "'fortran_order': False, 'shape': (2 , ) }"}) {
    const std::string bytes = npy_with_header(good);
    const HostArray a = parse_npy(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "x.npy");
    EXPECT_EQ(a.count(), 2) << good;
  }
  const std::string refusal = "x.npy: the .npy header is not a dictionary as numpy writes it (";
  const std::pair<const char*, const char*> bad[] = {
      // 'shape' taken from a nested value once gave this file the shape (2,).
      {"{'descr': '<f4', 'fortran_order': False, 'extra': {'shape': (2,)}, 'shape': (9,)}",
       "it has the key 'extra'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", "it has the key 'x'"},
      {"{'descr': '<f4', 'fortran_order': False}", "it has no key 'shape'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (2,)}", "'shape' is given twice"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2)}", "'shape' is not a tuple of sizes"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", "'shape' is not a tuple of sizes"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", "'shape' is not a tuple of sizes"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", "'fortran_order' is not True or False"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", "goes on after"},
      {"'descr': '<f4'", "expected '{'"},
  };
  for (const auto& [header, why] : bad) {
    const std::string message = npy_header_error(header);
    EXPECT_EQ(message.rfind(refusal, 0), 0u) << header << ": " << message;
    EXPECT_NE(message.find(why), std::string::npos) << header << ": " << message;
  }
}

TEST(ArrayDataset, IntegerTargetsAreClassesAndFloatTargetsRegressionOfTheirWidth) {
  const HostArray x = array_of<double>(DType::kFloat64, {3, 2}, {1, 2, 3, 4, 5, 6});
  const Dataset classes = make_array_dataset(x, array_of<uint8_t>(DType::kUInt8, {3}, {2, 0, 4}), "mem");
  EXPECT_FALSE(classes.regression());
  EXPECT_EQ(classes.num_classes, 5);
  EXPECT_EQ(classes.labels, (std::vector<int32_t>{2, 0, 4}));
  EXPECT_EQ(classes.features, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  const Dataset one = make_array_dataset(x, array_of<float>(DType::kFloat32, {3}, {0.5f, 1, 2}), "mem");
  EXPECT_EQ(one.target_width, 1);
  const Dataset wide = make_array_dataset(x, array_of<double>(DType::kFloat64, {3, 2}, {1, 2, 3, 4, 5, 6}), "mem");
  EXPECT_EQ(wide.target_width, 2);
  EXPECT_EQ(wide.targets, (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(ArrayDataset, MismatchedOrBadArraysAreRefusedNamingTheArray) {
  const HostArray x = array_of<float>(DType::kFloat32, {3, 2}, {1, 2, 3, 4, 5, 6});
  EXPECT_NE(error_message<InvalidArgument>([&] {
              make_array_dataset(x, array_of<float>(DType::kFloat32, {2}, {1, 2}), "d");
            }).find("d: targets have shape [2]; expected [3] or [3, W]"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] {
              make_array_dataset(x, array_of<int32_t>(DType::kInt32, {3}, {0, -1, 2}), "d");
            }).find("label -1 at row 1"),
            std::string::npos);
  // A value that is not finite is named by its row and column, as a person looks for it.
  const HostArray nan = array_of<float>(DType::kFloat32, {3, 2}, {1, 2, 3, NAN, 5, 6});
  EXPECT_EQ(error_message<InvalidArgument>([&] {
              make_array_dataset(nan, array_of<float>(DType::kFloat32, {3}, {1, 2, 3}), "d");
            }),
            "d: features: row 1, column 1 is nan, not a finite float32; clean the data first");
  EXPECT_NE(error_message<InvalidArgument>([&] {
              make_array_dataset(x, array_of<float>(DType::kFloat32, {3}, {1, INFINITY, 3}), "d");
            }).find("d: targets: row 1 is inf"),
            std::string::npos);
}

// An outlandish label is refused with the number of classes it asks for, not met by an out-of-memory on every
// rank when the model's output layer is built.
TEST(ArrayDataset, ALabelAskingForMoreClassesThanAModelCanHaveIsRefusedWithTheCount) {
  const HostArray x = array_of<float>(DType::kFloat32, {2, 1}, {1, 2});
  EXPECT_EQ(error_message<InvalidArgument>([&] {
              make_array_dataset(x, array_of<int32_t>(DType::kInt32, {2}, {0, 2000000000}), "d");
            }),
            "d: targets: label 2000000000 at row 1 asks for 2000000001 classes, more than 1048576 (the model's "
            "output layer has a row of weights per class); class labels are 0 to C-1: renumber them, or store "
            "float targets for regression");
  EXPECT_EQ(make_array_dataset(x, array_of<int32_t>(DType::kInt32, {2}, {0, kMaxClasses - 1}), "d").num_classes,
            kMaxClasses);
}

TEST(ArrayDataset, ReadFromANpyDirectoryOrASafetensorsFile) {
  const std::string dir = ddp::testing::fresh_scratch_dir("array_dataset");
  const std::vector<float> xs = {1, 2, 3, 4}, ys = {0.25f, 0.5f};
  write_npy(dir + "/features.npy", array_of<float>(DType::kFloat32, {2, 2}, xs));
  write_npy(dir + "/targets.npy", array_of<float>(DType::kFloat32, {2, 1}, ys));
  ASSERT_TRUE(is_array_dataset(dir));
  const Dataset from_npy = load_array_dataset(dir);
  EXPECT_EQ(from_npy.targets, ys);
  const std::string file = dir + "/data.safetensors";
  io::save_safetensors(file,
                       {{.name = "features", .dtype = DType::kFloat32, .shape = {2, 2}, .data = xs.data(), .bytes = 16},
                        {.name = "targets", .dtype = DType::kFloat32, .shape = {2, 1}, .data = ys.data(), .bytes = 8}},
                       {});
  const Dataset from_file = load_array_dataset(file);
  EXPECT_EQ(from_file.features, xs);
  EXPECT_EQ(from_file.targets, ys);
  const std::string no_targets = dir + "/x.safetensors";
  io::save_safetensors(
      no_targets, {{.name = "features", .dtype = DType::kFloat32, .shape = {2, 2}, .data = xs.data(), .bytes = 16}},
      {});
  EXPECT_NE(error_message<InvalidArgument>([&] {
              load_array_dataset(no_targets);
            }).find("x.safetensors: no tensor 'targets'"),
            std::string::npos);
  EXPECT_NE(error_message<InvalidArgument>([&] { load_array_dataset(dir + "/missing"); }).find("no such data set"),
            std::string::npos);
}

TEST(ArrayDataset, AFifoGivenAsDataIsRefusedWithinABoundNotOpened) {
  const std::string dir = ddp::testing::fresh_scratch_dir("array_dataset_fifo");
  write_npy(dir + "/targets.npy", array_of<float>(DType::kFloat32, {2}, {1, 2}));
  ASSERT_EQ(::mkfifo((dir + "/features.npy").c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo((dir + "/test.safetensors").c_str(), 0600), 0);
  const std::string npy = ddp::testing::error_message_within<InvalidArgument>(5, [&] { load_array_dataset(dir); });
  EXPECT_NE(npy.find(dir + "/features.npy: it is a FIFO (named pipe), not a regular file"), std::string::npos) << npy;
  const std::string file = ddp::testing::error_message_within<InvalidArgument>(5, [&] {
    load_array_dataset(dir + "/test.safetensors");
  });
  EXPECT_NE(file.find("test.safetensors: it is a FIFO (named pipe), not a regular file"), std::string::npos) << file;
}

// A mistyped path to one's own data is answered with what was looked for and what was found, never with how to
// install Fashion-MNIST.
TEST(LoadTrainTest, AMistypedPathSaysWhatWasLookedForAndWhatWasFound) {
  const std::string dir = ddp::testing::fresh_scratch_dir("data_paths");
  auto message = [](const std::string& path) {
    return error_message<InvalidArgument>([&] { load_train_test(path); });
  };
  const std::string forms = "name a directory with features.npy and targets.npy, a .safetensors file, or a "
                            "directory with the four Fashion-MNIST .gz files";
  EXPECT_EQ(message(""), "the data set's path is empty: " + forms);
  EXPECT_EQ(message(dir + "/nowhere"), "data set " + dir + "/nowhere: no such file or directory; " + forms);
  ASSERT_EQ(::symlink((dir + "/loop_a").c_str(), (dir + "/loop_b").c_str()), 0);
  ASSERT_EQ(::symlink((dir + "/loop_b").c_str(), (dir + "/loop_a").c_str()), 0);
  EXPECT_EQ(message(dir + "/loop_a"), "data set " + dir + "/loop_a: a loop of symbolic links; " + forms);
  ::mkdir((dir + "/targets_only").c_str(), 0700);
  write_npy(dir + "/targets_only/targets.npy", array_of<float>(DType::kFloat32, {2}, {1, 2}));
  EXPECT_EQ(message(dir + "/targets_only"), "data set " + dir + "/targets_only: the directory has targets.npy but "
            "no features.npy; a directory data set holds both (features [N, F], targets [N] or [N, W])");
  ::mkdir((dir + "/empty").c_str(), 0700);
  EXPECT_EQ(message(dir + "/empty"), "data set " + dir + "/empty: the directory holds neither features.npy and "
            "targets.npy nor Fashion-MNIST's files (train-images-idx3-ubyte.gz, ...); " + forms);
  write_bytes(dir + "/data.csv", "1,2\n");
  EXPECT_EQ(message(dir + "/data.csv"), "data set " + dir + "/data.csv: it is a regular file, neither a "
            ".safetensors file nor a directory; " + forms);
  if (::geteuid() != 0) {  // root searches any directory
    ::mkdir((dir + "/locked").c_str(), 0700);
    ::chmod((dir + "/locked").c_str(), 0);
    EXPECT_NE(message(dir + "/locked").find("the directory cannot be searched by this user"), std::string::npos);
    ::chmod((dir + "/locked").c_str(), 0700);
  }
}

// Rows 0..n-1 with features (i, -i) and targets (i/10, i/100, i/1000).
Dataset float_target_set(int64_t n) {
  Dataset d;
  d.size = n;
  d.feature_count = 2;
  d.target_width = 3;
  for (int64_t i = 0; i < n; ++i) {
    d.features.insert(d.features.end(), {static_cast<float>(i), -static_cast<float>(i)});
    d.targets.insert(d.targets.end(), {i / 10.0f, i / 100.0f, i / 1000.0f});
  }
  return d;
}

TEST(FloatTargets, TravelTheLoaderTheResidentDataSetAndTheEvaluationShard) {
  const Dataset d = float_target_set(23);
  const SamplerOptions so{.dataset_size = d.size, .num_replicas = 2, .rank = 1, .seed = 3};
  BatchLoader loader(view(d), DistributedSampler(so), LoaderOptions{.batch_size = 4});
  ResidentDataset resident(view(d), Device::cpu(), cpu_stream());
  DistributedSampler sampler(so);
  sampler.set_epoch(0);
  resident.set_order(sampler.indices(), cpu_stream());
  loader.start_epoch(0);
  int64_t position = 0;
  while (const Batch* b = loader.next()) {
    ASSERT_EQ(b->target_width, 3);
    const DeviceBatch on_device = to_device(*b, Device::cpu(), cpu_stream());
    EXPECT_EQ(on_device.labels.shape(), (Shape{b->size, 3}));
    Tensor x = Tensor::empty({b->size, 2}, DType::kFloat32, Device::cpu(), cpu_stream());
    Tensor y = resident.empty_y(b->size, cpu_stream());
    resident.gather(position, x, y, cpu_stream());
    position += b->size;
    const std::vector<float> gathered = y.to_vector<float>(cpu_stream());
    for (int64_t k = 0; k < b->size; ++k) {
      const int64_t row = (*b->sample_indices)[static_cast<std::size_t>(k)];
      for (int64_t j = 0; j < 3; ++j) {
        const float expected = d.targets[static_cast<std::size_t>(row * 3 + j)];
        EXPECT_EQ(b->targets[k * 3 + j], expected);
        EXPECT_EQ(gathered[static_cast<std::size_t>(k * 3 + j)], expected);
      }
    }
  }
  const EvaluationShard shard(d, 0, 2, Device::cpu(), cpu_stream(), 5);
  int64_t rows = 0;
  for (const DeviceBatch& chunk : shard.chunks()) {
    EXPECT_EQ(chunk.labels.dtype(), DType::kFloat32);
    const std::vector<float> t = chunk.labels.to_vector<float>(cpu_stream());
    for (int64_t k = 0; k < chunk.labels.size(0); ++k) {
      EXPECT_EQ(t[static_cast<std::size_t>(k * 3)],
                static_cast<float>(2 * (rows + k)) / 10.0f);  // rank 0: rows 0, 2, 4, ...
    }
    rows += chunk.labels.size(0);
  }
  EXPECT_EQ(rows, 12);
}

}  // namespace
}  // namespace data
}  // namespace ddp
