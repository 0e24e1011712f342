# Read by llama.cpp's CMake right after its project() call (the Makefile passes it as
# CMAKE_PROJECT_llama.cpp_INCLUDE). llama-cpp-python forces LLAMA_BUILD_COMMON on in its cache, but the
# Python package loads only libllama and libggml*: the common library (chat templates, argument parsing,
# an HTTP client) is a third of the compile and nothing here uses it. A normal variable set in
# llama.cpp's directory hides that cache entry from its `if (LLAMA_BUILD_COMMON)`.
set(LLAMA_BUILD_COMMON OFF)
