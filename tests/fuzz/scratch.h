// The fuzz targets' one scratch folder, /dev/shm/vit-fuzz-<pid>/, for readers that take only paths; removed at exit.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace vit::fuzz {

// Created on first use. Never destroyed: the exit handler that removes it runs after static destructors.
inline const std::string& scratch_dir() {
  static const std::string& dir = *[] {
    auto* path = new std::string("/dev/shm/vit-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(*path);
    std::atexit([] { std::filesystem::remove_all(scratch_dir()); });
    return path;
  }();
  return dir;
}

}  // namespace vit::fuzz
