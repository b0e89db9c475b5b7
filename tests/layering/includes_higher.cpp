// Must NOT compile when built for a layer below the header's (tests/CMakeLists.txt, "layering"):
// that layer's include path holds only its own folder and those of the layers it links.
#include PULSE_LAYERING_HEADER

int main() { return 0; }
