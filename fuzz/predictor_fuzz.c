/* predictor_fuzz.c: libFuzzer harness for the boundary-predictor file
 * reader (src/route/predictor.c). Any input must load or be refused with a
 * sentence; a loaded predictor must report its sizes.
 * Run: make fuzz.
 */
#include <stdint.h>
#include <stdlib.h>

#include "dhsa.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dhsa_predictor *p = NULL;
    dhsa_status st = dhsa_predictor_load_memory(data, size, &p);
    if (st == DHSA_OK) {
        if (!p || dhsa_predictor_width(p) < 1 || dhsa_predictor_window(p) < 1) abort();
        dhsa_predictor_free(p);
    } else if (p || !dhsa_last_error()[0]) {
        abort();
    }
    return 0;
}
