/* Prints one RULER item as raw text (the user message, a space, the answer
** prefix), a record separator, and the expected strings one per line; for
** tests/cli/test_ruler_format.py, which compares it with tasks.py.
** usage: ruler_dump TASK SEED INDEX N_FILLER */
#include <stdio.h>
#include <stdlib.h>

#include "common/error.h"
#include "quality/ruler.h"

int main(int argc, char **argv) {
  enum tsr_ruler_task t;
  if (argc != 5 || tsr_ruler_task_parse(argv[1], &t) != TSR_OK) {
    fprintf(stderr, "usage: %s TASK SEED INDEX N_FILLER\n", argv[0]);
    return 2;
  }
  struct tsr_ruler_item it;
  if (tsr_ruler_make(t, strtoull(argv[2], NULL, 10), atoll(argv[3]), atoll(argv[4]), &it) !=
      TSR_OK) {
    fprintf(stderr, "%s\n", tsr_error_message());
    return 1;
  }
  printf("%s %s\x1e", it.user, it.answer_prefix);
  for (int i = 0; i < it.n_refs; i++) printf("%s\n", it.refs[i]);
  tsr_ruler_item_free(&it);
  return 0;
}
