// libvitlens_keep_loaded.so, LD_PRELOADed by scripts/test-sanitize.sh in the sanitizer build only:
// dlclose() does nothing, so every shared library stays mapped until the process exits.
// Why: GLFW's glfwTerminate unloads libGL, the Mesa driver and the X extension libraries it
// opened; LeakSanitizer runs after that and could then name neither the library nor the function
// of an allocation they made ("<unknown module>"), so lsan.supp could not match them by library
// while a leak in vitlens would look the same. With the libraries kept, every leak report names
// its library, and only the OpenGL / GLFW / X11 ones are suppressed.
#include <dlfcn.h>

extern "C" int dlclose(void*) { return 0; }
