/* Keeps docs/bad-inputs.md true: its matrix lists exactly the documented rows of the bad-input
 * table (tests/support/bad_inputs.h), each with the table's status and text. The table's rows
 * are run by test_validation (tests/c), so every row of the document is run there.
 *
 * Usage: test_bad_inputs_doc PATH/TO/docs/bad-inputs.md */
#include "bad_inputs.h"

static int find_row(const char* id) {
    for (int i = 0; i < BAD_INPUT_COUNT; ++i)
        if (strcmp(bad_inputs[i].id, id) == 0) return i;
    return -1;
}

/* A cell with surrounding blanks and one pair of backticks removed, in place. */
static char* cell_text(char* cell) {
    while (*cell == ' ') ++cell;
    char* end = cell + strlen(cell);
    while (end > cell && end[-1] == ' ') *--end = '\0';
    if (end - cell >= 2 && cell[0] == '`' && end[-1] == '`') {
        end[-1] = '\0';
        ++cell;
    }
    return cell;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s docs/bad-inputs.md\n", argv[0]);
        return 2;
    }
    FILE* doc = fopen(argv[1], "r");
    if (!doc) {
        perror(argv[1]);
        return 1;
    }
    int listed[BAD_INPUT_COUNT] = {0};
    int rows = 0, in_matrix = 0;
    char line[1024];
    /* The matrix is the table under the "## The matrix" heading: | `id` | input | `status` | `text` | */
    while (fgets(line, sizeof line, doc)) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "## ", 3) == 0) in_matrix = strcmp(line, "## The matrix") == 0;
        if (!in_matrix || strncmp(line, "| `", 3) != 0) continue;
        char* cells[5];
        int n = 0;
        for (char* p = strtok(line + 1, "|"); p && n < 5; p = strtok(NULL, "|"))
            cells[n++] = cell_text(p);
        ++rows;
        if (n != 4) {
            CHECK(0, "malformed matrix row (needs 4 cells): %s", line);
            continue;
        }
        const int index = find_row(cells[0]);
        if (index < 0 || !bad_inputs[index].documented) {
            CHECK(0, "docs/bad-inputs.md row `%s` is not a documented row of bad_inputs.h",
                  cells[0]);
            continue;
        }
        const bad_input* row = &bad_inputs[index];
        CHECK(!listed[index], "row `%s` appears twice", row->id);
        listed[index] = 1;
        CHECK(strcmp(cells[2], test_status_name(row->status)) == 0,
              "row `%s`: the doc says %s, the table %s", row->id, cells[2],
              test_status_name(row->status));
        CHECK(strcmp(cells[3], row->text) == 0,
              "row `%s`: the doc's text \"%s\", the table's \"%s\"", row->id, cells[3], row->text);
    }
    fclose(doc);
    int documented = 0;
    for (int i = 0; i < BAD_INPUT_COUNT; ++i) {
        documented += bad_inputs[i].documented;
        CHECK(listed[i] || !bad_inputs[i].documented,
              "documented bad input `%s` has no row in docs/bad-inputs.md", bad_inputs[i].id);
    }
    printf("test_bad_inputs_doc: %d rows of the document, %d documented rows of the table\n", rows,
           documented);
    return test_finish("test_bad_inputs_doc");
}
