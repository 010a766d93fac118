#include "akv/eval/ruler_words.h"

#include <sstream>

namespace akv::ruler_words {
namespace {

std::vector<std::string> split(const char* text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

}  // namespace

const std::vector<std::string>& adjectives() {
  static const std::vector<std::string> v = split(
      "able ancient angry bitter black blue bold brave brief bright broad broken busy calm careful "
      "cheap clean clear clever cold cool crisp curious damp dark deep dense dry dull eager early "
      "empty even faint fair false famous fancy fast fierce flat fond fresh friendly funny gentle "
      "giant glad golden good grand gray great green happy hard heavy hidden high hollow honest "
      "huge humble hungry icy idle kind large late lazy light little lively lonely long loud lucky "
      "mellow mild modern narrow neat nervous new noble odd old open orange pale patient plain "
      "polite poor proud pure purple quick quiet rapid rare raw red rich rough round royal rusty "
      "sad safe salty sharp shiny short silent silver simple slow small smooth soft solid sour "
      "spare steep sticky stiff strange strict strong sudden sunny sweet swift tall tame tender "
      "thick thin tidy tiny tired tough true vast warm weak wet white wide wild wise witty "
      "wooden yellow young");
  return v;
}

const std::vector<std::string>& nouns() {
  static const std::vector<std::string> v = split(
      "anchor apple arrow autumn badge bakery balloon banana barn basket beach beacon bell bench "
      "bicycle blanket boat bottle bracelet branch bridge brush bucket button cabin cactus camera "
      "candle canyon carpet castle cellar chair channel cherry chimney circle citadel cliff clock "
      "cloud coast comet compass cookie copper corner cottage crayon crown cup curtain dagger desk "
      "diamond dolphin door dragon drum eagle engine falcon feather fence ferry field fiddle flag "
      "flute forest fountain fox garden garnet gate glacier glove goat guitar hammer harbor hat "
      "helmet hill honey horizon island jacket jungle kettle kite ladder lake lantern lemon letter "
      "library lion lizard magnet mango map marble meadow mirror mitten monkey moon mountain "
      "needle nest notebook ocean office orchard otter oven owl paddle palace panda parrot pebble "
      "pencil pepper piano pillow planet plum pocket pond potato puzzle quarry rabbit radio "
      "raven ribbon river robot rocket saddle sailor salmon sandal scarf shadow shell shovel "
      "signal skate sparrow spider spoon squirrel stable statue stone storm stove street sugar "
      "summit sunset table teapot temple tiger tower tractor trail train tulip tunnel turtle "
      "umbrella valley violin wagon wallet whale whistle window winter wizard wolf yacht zebra");
  return v;
}

const std::vector<std::string>& verbs() {
  static const std::vector<std::string> v = split(
      "admired avoided borrowed built carried chased cleaned climbed collected covered crossed "
      "described discovered dropped earned entered explored fixed followed found gathered guarded "
      "held helped hid joined kept lifted liked lost moved noticed opened painted passed pulled "
      "pushed reached repaired saved shared showed sold sorted studied touched traded visited "
      "warned washed watched welcomed");
  return v;
}

const std::vector<std::string>& adverbs() {
  static const std::vector<std::string> v = split(
      "again calmly carefully early finally gladly gently happily later loudly nearly often "
      "quickly quietly rarely slowly soon suddenly today together");
  return v;
}

}  // namespace akv::ruler_words
