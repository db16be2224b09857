# 64-bit Arm through Debian's cross compiler (g++-aarch64-linux-gnu), its libraries in /usr/aarch64-linux-gnu; what
# it builds runs on this machine under qemu-user (scripts/cross-aarch64.sh).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)  # host tools
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)   # target libraries and headers: never the host's x86-64 ones
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
